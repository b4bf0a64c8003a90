"""The aiohttp application: routes, error handling and the lifecycle of background work."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics, generate_latest

from gateway import headers
from gateway.app_keys import (
    FORWARDER,
    LIFECYCLE,
    LIMITER,
    MEMORY,
    METRICS,
    OUTLIERS,
    POD_METRICS,
    POLICY,
    SETTINGS,
    TOKEN_KEYS,
    Lifecycle,
)
from gateway.background import stop_tasks
from gateway.fleet.adapter_discovery import ROUNDS_PER_SCRAPE, discover_forever
from gateway.fleet.kv_events import KvEventSubscriptions
from gateway.fleet.monitor import ProbeSettings, ReplicaMonitor
from gateway.fleet.outlier import OutlierDetector, OutlierSettings
from gateway.fleet.pools import Fleet
from gateway.http import responses_lookup
from gateway.http.admin_route import admin_route
from gateway.http.body_read import UnreadBody, body_too_large, read_body
from gateway.http.completions import complete, count_error
from gateway.http.errors import ApiError, aiohttp_error, expectation_failed, internal_error
from gateway.http.exchange import AiohttpExchange
from gateway.http.models_list import model_card, model_list
from gateway.http.request_body import Endpoint
from gateway.http.request_ids import request_id
from gateway.policy.reload import PolicyHolder
from gateway.rate_limit.keys import bearer
from gateway.rate_limit.make import make_limiter
from gateway.relay.proxy import Forwarder
from gateway.relay.upstream import Upstreams
from gateway.routing.affinity import RoutingMemory
from gateway.routing.tokenize import TokenKeys
from gateway.settings import Settings
from gateway.shared_state import make_shared_state
from gateway.shared_state.worker_mesh import MeshPlace
from gateway.state_backend import choose_backend, policy_refusal
from gateway.supervisor import reload_every_worker
from gateway.telemetry.logs import REQUEST_ID
from gateway.telemetry.metrics import NO_POOL, GatewayMetrics
from router_policies.schema import Policy

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the gateway answers itself has the OpenAI body, never a stack trace; every
    log line about the request carries its id; shutdown can find the request while it runs."""
    REQUEST_ID.set(request_id(request.headers))
    task = asyncio.current_task()
    inflight = request.app[LIFECYCLE].inflight
    if task is not None:
        inflight.add(task)
    try:
        response = await _answer_errors(request, handler)
        if not response.prepared:  # models, probes, admin: the id, as on every answer
            response.headers.setdefault(headers.REQUEST_ID, REQUEST_ID.get())
            if request.body_exists and not request.content.is_eof():
                await _discard_body(request, response)
        return response
    finally:
        if task is not None:
            inflight.discard(task)


async def _discard_body(request: web.Request, response: web.StreamResponse) -> None:
    """Reads the body of a request answered without it (404, 403, 405...).

    aiohttp would read it after the answer, and log a traceback if it cannot be decoded; and
    closing the connection with it unread makes the kernel reset the connection, which can
    destroy the answer before the client reads it."""
    try:
        await read_body(request, request.app[SETTINGS].body_timeout_s)
    except (ApiError, web.HTTPException):
        response.force_close()  # read_body has marked the rest unreadable


async def _answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPRequestEntityTooLarge:
        error = body_too_large(request.app[SETTINGS].max_body_bytes)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = aiohttp_error(exc)
    except ConnectionResetError:
        raise  # the client is gone: nothing to answer, aiohttp drops the connection
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        if request.writer.output_size > 0:
            raise  # a response has started: another one would corrupt the connection
        error = internal_error()
    count_error(request.app, request.path, error.status)
    response = error.response({headers.REQUEST_ID: REQUEST_ID.get()})
    if isinstance(error, UnreadBody):
        response.force_close()
    return response


def completion_handler(endpoint: Endpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        """A completion request the front handed over (gateway/http/front.py)."""
        started = time.perf_counter()
        app = request.app
        # One generation of the policy for the whole request, however long it streams.
        fleet = app[POLICY].fleet
        tenant = app[LIMITER].authenticate(fleet.policy.limits, request.headers)
        raw = await read_body(request, app[SETTINGS].body_timeout_s)
        exchange = AiohttpExchange(request, app[SETTINGS].send_timeout_s)
        forward = functools.partial(app[FORWARDER].forward, exchange)
        await complete(app, fleet, tenant, endpoint, request.headers, raw, started, forward)
        assert exchange.response is not None
        return exchange.response

    return handle


def _caller_may_see(request: web.Request) -> Fleet:
    """The policy generation, once the caller's key passes where the policy has tenants: the
    models, tiers and adapters served are theirs to see (OpenAI answers 401 without a key)."""
    fleet = request.app[POLICY].fleet
    request.app[LIMITER].authenticate(fleet.policy.limits, request.headers)
    return fleet


async def list_models(request: web.Request) -> web.Response:
    fleet = _caller_may_see(request)
    request.app[METRICS].requests.labels(NO_POOL, NO_POOL, "200").inc()
    return _json(model_list(fleet, request.app[MEMORY].learned_adapters))


async def retrieve_model(request: web.Request) -> web.Response:
    adapters = request.app[MEMORY].learned_adapters
    card = model_card(_caller_may_see(request), request.match_info["model"], adapters)
    request.app[METRICS].requests.labels(NO_POOL, NO_POOL, "200").inc()
    return _json(card)


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    pools = {name: len(p.routable()) for name, p in request.app[POLICY].fleet.pools.items()}
    if request.app[LIFECYCLE].draining:
        # Load balancers take the pod out while it still serves what they already sent.
        return _json({"ready": False, "draining": True, "healthy_replicas": pools}, 503)
    # ?pools=any: ready while a pool can serve (the chart's probe: every gateway pod turned
    # unready by one pool's outage would take the others' traffic down with it).
    is_ready = (any if request.query.get("pools") == "any" else all)(pools.values())
    return _json({"ready": is_ready, "healthy_replicas": pools}, 200 if is_ready else 503)


async def metrics(request: web.Request) -> web.Response:
    pod = request.app.get(POD_METRICS)
    body = generate_latest(request.app[METRICS].registry) if pod is None else await pod.exposition()
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
        sent = bearer(request.headers)  # as tenant keys are read: the scheme in any case
        # Bytes that are not UTF-8 reach us as surrogates (aiohttp decodes headers with
        # surrogateescape): encoded back the same way, they are compared as sent, not raised.
        expected = token.get_secret_value().encode(errors="surrogateescape")
        if sent is None or not hmac.compare_digest(sent.encode(errors="surrogateescape"), expected):
            raise ApiError(
                401, "A valid admin bearer token is required.", type_="authentication_error",
                code="invalid_admin_token",
            )  # fmt: skip
        return await handler(request)

    return guarded


async def admin_reload(request: web.Request) -> web.Response:
    result = await reload_every_worker(request.app[POLICY])
    answer = {"reloaded": result.ok, "problems": [*result.problems], "warnings": [*result.warnings]}
    return _json(answer, 200 if result.ok else 422)


async def admin_policy(request: web.Request) -> web.Response:
    return _json(request.app[POLICY].fleet.policy.model_dump(mode="json"))


def build_app(settings: Settings, policy: Policy, mesh: MeshPlace | None = None) -> web.Application:
    """The gateway; ``mesh``: this process is one of `serve --workers N`, sharing with the
    others over the mesh when no Redis is configured."""
    # *_created series double the exposition for no use an HPA or a dashboard has.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[openai_errors])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()
    app[MEMORY] = RoutingMemory()
    app[METRICS] = GatewayMetrics(lambda: app[POLICY].fleet)
    app[POLICY] = PolicyHolder(
        policy,
        settings.policy,
        app[METRICS].policy_reloaded,
        refuse=policy_refusal(settings),
    )
    app.cleanup_ctx.append(lambda app: _background(app, mesh))
    # Every route answers an Expect header as the middleware answers errors (aiohttp's own
    # handler would answer plain text, echoing it).
    get = functools.partial(app.router.add_get, expect_handler=_expect)
    post = functools.partial(app.router.add_post, expect_handler=_expect)
    for endpoint in Endpoint:
        post(endpoint.value, completion_handler(endpoint))
    get("/v1/models", list_models)
    get("/v1/models/{model:.+}", retrieve_model)
    responses_lookup.add_routes(
        app, lambda: app[POLICY].fleet, app[MEMORY], app[METRICS], lambda: app[LIMITER], _expect
    )
    get("/health", health)
    get("/ready", ready)
    get("/metrics", metrics)
    post("/admin/reload", admin(admin_reload))
    get("/admin/policy", admin(admin_policy))
    post("/admin/route", admin(admin_route))
    return app


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """A 100 Continue for a body within the limit; a 413 for one over it (before it is sent),
    a 417 for another expectation, as the middleware answers errors (it runs after this)."""
    if request.version != aiohttp.HttpVersion11:
        return None
    expect = request.headers.get("Expect", "").lower()
    limit = request.app[SETTINGS].max_body_bytes
    if expect == "100-continue" and (request.content_length or 0) <= limit:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim line is not the response
        return None
    error = body_too_large(limit) if expect == "100-continue" else expectation_failed()
    count_error(request.app, request.path, error.status)
    # The body it announced is not coming: the connection closes after the answer, at once
    # (not read on as that body, nor lingered on for it).
    request.content.feed_eof()
    response = error.response({headers.REQUEST_ID: request_id(request.headers)})
    response.force_close()
    return response


async def _background(app: web.Application, mesh: MeshPlace | None) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    holder = app[POLICY]
    # No connection cap: the replicas' own batching limits are the back-pressure that counts.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        outliers = OutlierDetector(
            OutlierSettings(
                settings.outlier_consecutive_failures,
                settings.outlier_base_ejection_s,
                settings.outlier_max_ejection_s,
                settings.outlier_max_ejected_share,
            ),
            app[METRICS].ejections,
        )
        upstreams = Upstreams(settings.connect_timeout_s, settings.first_byte_timeout_s)
        app[OUTLIERS] = outliers
        tracing = None
        if settings.otel:
            from gateway.telemetry.tracing import TracedForwarder, Tracing, otlp_provider

            tracing = Tracing(otlp_provider())
            app[FORWARDER] = TracedForwarder(
                upstreams, settings, app[METRICS], outliers, tracing=tracing
            )
        else:
            app[FORWARDER] = Forwarder(upstreams, settings, app[METRICS], outliers)
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
        app[TOKEN_KEYS] = TokenKeys(session)
        kv_events = KvEventSubscriptions(lambda: holder.fleet)
        await kv_events.start()
        # Chosen once: the backend cannot change under a running process (a reload keeps it).
        backend = choose_backend(settings, holder.fleet.policy)
        log.info("shared state: %s", backend.describe())
        shared = make_shared_state(settings, backend, app[METRICS], mesh)
        shared.share_memory(app[MEMORY])
        await shared.start(lambda: holder.fleet)
        app[LIMITER] = make_limiter(settings, backend, app[METRICS])
        watcher = asyncio.create_task(
            holder.watch(settings.policy_watch_interval_s), name="policy file watch"
        )
        discovery = asyncio.create_task(
            discover_forever(
                lambda: holder.fleet, session, app[MEMORY].learned_adapters,
                settings.scrape_interval_s * ROUNDS_PER_SCRAPE,
            ),
            name="adapter discovery",
        )  # fmt: skip
        try:
            yield
        finally:
            await stop_tasks((watcher, discovery))
            await upstreams.close()
            await shared.stop()
            await app[LIMITER].close()
            await kv_events.stop()
            await monitor.stop()
            if tracing is not None:
                await tracing.close()  # last: the spans still batched, as long as it may
