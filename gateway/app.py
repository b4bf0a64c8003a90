"""The aiohttp application: routes, error handling and the lifecycle of background work."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics, generate_latest

from gateway import headers
from gateway.errors import GatewayError, model_not_found
from gateway.metrics import NO_POOL, GatewayMetrics
from gateway.proxy import Forwarder, Routed
from gateway.request_body import Endpoint, parse_request
from gateway.settings import Settings
from replica.monitor import ProbeSettings, ReplicaMonitor
from replica.state import Fleet
from router_policies.fingerprint import fingerprint
from router_policies.schema import Policy

log = logging.getLogger(__name__)

FLEET = web.AppKey("fleet", Fleet)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", GatewayMetrics)
FORWARDER = web.AppKey("forwarder", Forwarder)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _request_id(request: web.Request) -> str:
    return request.headers.get(headers.REQUEST_ID) or uuid.uuid4().hex


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the gateway answers itself has the OpenAI body, never a stack trace."""
    try:
        return await handler(request)
    except GatewayError as exc:
        error = exc
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        error = GatewayError(
            413, f"The request body is larger than the limit of {limit} bytes.",
            code="request_too_large",
        )  # fmt: skip
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = GatewayError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_"))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = GatewayError(500, "Internal gateway error.", type_="server_error")
    if request.path.startswith("/v1/"):
        request.app[METRICS].requests.labels(NO_POOL, NO_POOL, str(error.status)).inc()
    return error.response({headers.REQUEST_ID: _request_id(request)})


def completion_handler(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = _request_id(request)
        parsed = parse_request(endpoint, await request.read())
        fleet = request.app[FLEET]
        pool = fleet.pool_for_model(parsed.model)
        if pool is None:
            raise model_not_found(parsed.model)
        prefix = pool.policy.prefix
        features = fingerprint(
            parsed.model,
            parsed.canonical_text(),
            prefix.block_bytes,
            prefix.max_blocks,
            parsed.cache_salt,
        )
        routed = Routed(parsed, pool, features, request_id, started)
        return await request.app[FORWARDER].forward(request, routed)

    return handle


async def list_models(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    data = [
        {"id": model, "object": "model", "created": 0, "owned_by": "llm-gateway"}
        for model in fleet.models()
    ]
    return _json({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    pools = {name: len(pool.healthy()) for name, pool in request.app[FLEET].pools.items()}
    is_ready = all(pools.values())
    return _json({"ready": is_ready, "healthy_replicas": pools}, 200 if is_ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(settings: Settings, policy: Policy) -> web.Application:
    # *_created series double the exposition for no use an HPA or a dashboard has.
    disable_created_metrics()
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[openai_errors])
    app[SETTINGS] = settings
    app[FLEET] = Fleet(policy)
    app[METRICS] = GatewayMetrics(lambda: app[FLEET])
    app.cleanup_ctx.append(_background)
    app.router.add_post(Endpoint.CHAT.value, completion_handler(Endpoint.CHAT))
    app.router.add_post(Endpoint.COMPLETIONS.value, completion_handler(Endpoint.COMPLETIONS))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # No connection cap: the replicas' own batching limits are the back-pressure that counts.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        app[FORWARDER] = Forwarder(session, settings, app[METRICS])
        monitor = ReplicaMonitor(
            lambda: app[FLEET],
            session,
            ProbeSettings(
                settings.health_interval_s,
                settings.health_timeout_s,
                settings.unhealthy_after,
                settings.healthy_after,
                settings.scrape_interval_s,
            ),
        )
        await monitor.start()
        try:
            yield
        finally:
            await monitor.stop()
