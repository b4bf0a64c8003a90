"""The aiohttp application: routes, error handling and the lifecycle of background work."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics, generate_latest

from gateway import headers
from gateway.errors import ApiError
from gateway.explain import explain
from gateway.metrics import NO_POOL, GatewayMetrics
from gateway.monitor import ProbeSettings, ReplicaMonitor
from gateway.policy_reload import PolicyHolder
from gateway.proxy import Forwarder, Routed
from gateway.request_body import Endpoint, parse_request
from gateway.resolve import resolve
from gateway.settings import Settings
from router_policies.schema import Policy

log = logging.getLogger(__name__)

POLICY = web.AppKey("policy", PolicyHolder)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", GatewayMetrics)
FORWARDER = web.AppKey("forwarder", Forwarder)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


_ID_PREFIX = secrets.token_hex(6)
_id_counter = itertools.count(1)


def _request_id(request: web.Request) -> str:
    # Unique across processes by the random prefix, within one by the counter: no syscall
    # per request, unlike uuid4.
    return request.headers.get(headers.REQUEST_ID) or f"{_ID_PREFIX}{next(_id_counter):010x}"


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the gateway answers itself has the OpenAI body, never a stack trace."""
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_body_bytes
        error = ApiError(
            413, f"The request body is larger than the limit of {limit} bytes.",
            code="request_too_large",
        )  # fmt: skip
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = ApiError(exc.status, exc.reason, code=exc.reason.lower().replace(" ", "_"))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        error = ApiError(500, "Internal gateway error.", type_="server_error")
    if request.path.startswith("/v1/"):
        request.app[METRICS].requests.labels(NO_POOL, NO_POOL, str(error.status)).inc()
    return error.response({headers.REQUEST_ID: _request_id(request)})


def completion_handler(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = _request_id(request)
        parsed = parse_request(endpoint, await request.read())
        # One generation of the policy for the whole request, however long it streams.
        resolution = resolve(request.app[POLICY].fleet, parsed, request.headers.get(headers.TIER))
        resolution.pool.arrivals += 1
        if resolution.tier_router is not None and resolution.verdict is not None:
            if not resolution.verdict.forced:
                resolution.tier_router.observe(resolution.verdict)
        routed = Routed(
            resolution.parsed,
            resolution.pool,
            resolution.features,
            request_id,
            started,
            resolution.response_headers(),
            resolution.route,
        )
        return await request.app[FORWARDER].forward(request, routed)

    return handle


async def list_models(request: web.Request) -> web.Response:
    data = [
        {"id": model, "object": "model", "created": 0, "owned_by": "llm-gateway"}
        for model in request.app[POLICY].fleet.models()
    ]
    return _json({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    pools = {name: len(p.healthy()) for name, p in request.app[POLICY].fleet.pools.items()}
    is_ready = all(pools.values())
    return _json({"ready": is_ready, "healthy_replicas": pools}, 200 if is_ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def admin(handler: Handler) -> Handler:
    """Admin endpoints need the bearer token; with no token configured they stay closed."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        token = request.app[SETTINGS].admin_token
        if token is None:
            raise ApiError(
                403, "Admin endpoints are disabled: set GATEWAY_ADMIN_TOKEN to enable them.",
                type_="permission_error", code="admin_disabled",
            )  # fmt: skip
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), token.get_secret_value().encode()):
            raise ApiError(
                401, "A valid admin bearer token is required.", type_="authentication_error",
                code="invalid_admin_token",
            )  # fmt: skip
        return await handler(request)

    return guarded


async def admin_reload(request: web.Request) -> web.Response:
    result = request.app[POLICY].reload()
    return _json(
        {"reloaded": result.ok, "problems": list(result.problems)}, 200 if result.ok else 422
    )


async def admin_policy(request: web.Request) -> web.Response:
    return _json(request.app[POLICY].fleet.policy.model_dump(mode="json"))


async def admin_route(request: web.Request) -> web.Response:
    """The decision a request would get, without sending it: for operators tuning weights."""
    endpoint = Endpoint(request.query.get("endpoint", Endpoint.CHAT.value))
    parsed = parse_request(endpoint, await request.read())
    resolution = resolve(request.app[POLICY].fleet, parsed, request.headers.get(headers.TIER))
    decision = resolution.pool.decide(resolution.features, explain=True)
    tier = None
    if resolution.verdict is not None:
        verdict = resolution.verdict
        tier = {
            "tier": verdict.tier.value,
            "score": verdict.score.score,
            "threshold": verdict.threshold,
            "forced": verdict.forced,
            "features": dict(verdict.score.features),
            "contributions": dict(verdict.score.contributions),
        }
    route = resolution.route or (decision.route if decision else None)
    return _json(
        {
            "model": parsed.model,
            "tier": tier,
            "pool": resolution.pool.name,
            "replica": decision.replica if decision else None,
            "route": route.value if route else None,
            "matched_blocks": decision.matched_blocks if decision else 0,
            "fingerprint_blocks": len(resolution.features.block_hashes),
            "chars_per_token": round(resolution.pool.chars_per_token, 3),
            **explain(decision),
        }
    )


def build_app(settings: Settings, policy: Policy) -> web.Application:
    # *_created series double the exposition for no use an HPA or a dashboard has.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[openai_errors])
    app[SETTINGS] = settings
    app[METRICS] = GatewayMetrics(lambda: app[POLICY].fleet)
    app[POLICY] = PolicyHolder(policy, settings.policy, app[METRICS].policy_reloads)
    app.cleanup_ctx.append(_background)
    app.router.add_post(Endpoint.CHAT.value, completion_handler(Endpoint.CHAT))
    app.router.add_post(Endpoint.COMPLETIONS.value, completion_handler(Endpoint.COMPLETIONS))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/admin/reload", admin(admin_reload))
    app.router.add_get("/admin/policy", admin(admin_policy))
    app.router.add_post("/admin/route", admin(admin_route))
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    holder = app[POLICY]
    # No connection cap: the replicas' own batching limits are the back-pressure that counts.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        app[FORWARDER] = Forwarder(session, settings, app[METRICS])
        monitor = ReplicaMonitor(
            lambda: holder.fleet,
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
        watcher = asyncio.create_task(holder.watch(settings.policy_watch_interval_s))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await monitor.stop()
