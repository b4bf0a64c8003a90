"""`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: relayed to the replica
that stored the response (vLLM keeps it in that server's memory; gateway/routing/affinity.py
learned where, and the shared state tells the other processes).

These calls carry no prompt and are rare (a client polling a background response, or stopping
one): no routing decision, no retry elsewhere, a plain relay of what the replica answers,
streamed as it comes (`?stream=true` replays a background response's events). They pass the
same key check and request limit as the generating endpoints, and a tenant reaches only the
responses its own requests stored: another tenant's id is not found, as if it did not exist.
`stored_home` is that check, for the picker (`llm-gateway epp`) too, which names the replica
to Envoy instead of relaying.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
from aiohttp import web

from gateway import headers
from gateway.fleet.pools import Fleet, PoolState, ReplicaState
from gateway.http.errors import (
    ApiError,
    WithHeaders,
    bad_request,
    echoed,
    replica_unreachable,
    stored_response_unavailable,
)
from gateway.http.request_body import Endpoint, ParsedRequest
from gateway.rate_limit import RateLimiter
from gateway.routing.affinity import HomesUnavailable, ReplicaRef, ResponseHomes, RoutingMemory
from gateway.telemetry.logs import REQUEST_ID
from gateway.telemetry.metrics import GatewayMetrics
from router_policies.decision import Route

SESSION = web.AppKey("responses_lookup_session", aiohttp.ClientSession)
_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=3.0, sock_read=600.0)
_FORWARDED = ("Authorization", "traceparent", "tracestate", "Accept")


def not_found(response_id: str, param: str = "response_id") -> ApiError:
    """vLLM's own answer for a response it does not hold."""
    return ApiError(404, f"Response with id '{echoed(response_id)}' not found.", param=param)


async def readable_home(
    homes: ResponseHomes, response_id: str, tenant: str | None, param: str, tenants: bool
) -> ReplicaRef | None:
    """Where the response is stored (None: unknown to the gateway); a 404 when it belongs to
    another tenant, or, where the policy has ``tenants``, when the gateway cannot tell whose it
    is (a restarted, empty Redis; one stored while Redis was away; forgotten): routed anyway,
    another tenant's would be read wherever the replica happens to hold it. That holds for a
    key `allow_unknown_keys` lets in as much as for a tenant's."""
    try:
        home = await homes.find(response_id)
    except HomesUnavailable:
        # It may well exist: another process stored it, and where is unknown for now.
        raise stored_response_unavailable(
            f"Where response '{echoed(response_id)}' is stored cannot be looked up right now "
            "(the gateway's shared state is unreachable); retry shortly.", param,
        ) from None  # fmt: skip
    if (home is None and tenants) or (home is not None and not home.readable_by(tenant)):
        raise not_found(response_id, param)
    return home


def refuse_chosen_id(parsed: ParsedRequest) -> None:
    """With tenants, a `/v1/responses` request may not choose its response's id: vLLM takes
    one from the body's `request_id`, and an id another tenant's response has would have
    vLLM overwrite that response (store=true), or its answer claim the id."""
    if parsed.endpoint is Endpoint.RESPONSES and "request_id" in parsed.body:
        raise bad_request(
            "'request_id' is not accepted on /v1/responses: the gateway names stored "
            "responses itself; leave it out, and use the id the answer carries.",
            param="request_id", code="request_id_not_allowed",
        )  # fmt: skip


async def stored_home(
    limiter: RateLimiter,
    fleet: Fleet,
    homes: ResponseHomes,
    sent: Mapping[str, str],
    response_id: str,
) -> tuple[PoolState, ReplicaState, dict[str, str]]:
    """The response's pool and replica, and the x-ratelimit-* headers of the answer, for a
    lookup with the client's headers ``sent`` (`serve`'s and the picker's alike): the key
    checked, one request taken from the tenant's request limit, the owner checked. A 404 for
    an id not found or not the tenant's, a 503 while its replica is not healthy or while the
    shared state that would know it cannot be asked."""
    tenant = limiter.authenticate(fleet.policy.limits, sent)
    if tenant is None:
        return (*await _stored_on(fleet, homes, None, response_id), {})
    # The request limit only: nothing is generated.
    limits = (await limiter.admit(tenant, 0.0)).headers
    try:
        return (*await _stored_on(fleet, homes, tenant.name, response_id), limits)
    except ApiError as error:
        # With its x-ratelimit-* headers, as every answer to a limited tenant.
        raise WithHeaders(error, limits) from None


def pinned_headers(
    pool: PoolState, replica: ReplicaState, limits: Mapping[str, str]
) -> dict[str, str]:
    """The gateway's headers on a lookup's answer: where it went, and the tenant's limits."""
    return {
        headers.REQUEST_ID: REQUEST_ID.get(),
        headers.POOL: pool.name,
        headers.REPLICA: replica.name,
        headers.ROUTE: Route.PINNED,
        **limits,
    }


async def _stored_on(
    fleet: Fleet, homes: ResponseHomes, owner: str | None, response_id: str
) -> tuple[PoolState, ReplicaState]:
    tenants = bool(fleet.policy.limits.tenants)
    home = await readable_home(homes, response_id, owner, "response_id", tenants)
    pool = fleet.pools.get(home.pool) if home is not None else None
    replica = pool.replicas.get(home.replica) if pool is not None and home else None
    if pool is None or replica is None:
        raise not_found(response_id)
    if not replica.healthy:
        raise stored_response_unavailable(
            f"Response with id '{response_id}' is stored on replica {replica.name}, which is "
            "not healthy now; retry later.",
            "response_id",
        )
    return pool, replica


class ResponseLookup:
    def __init__(
        self,
        fleet: Callable[[], Fleet],
        memory: RoutingMemory,
        metrics: GatewayMetrics,
        limiter: Callable[[], RateLimiter],
    ) -> None:
        self._fleet = fleet
        self._memory = memory
        self._metrics = metrics
        self._limiter = limiter

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return await self._relay(request, "GET", "")

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        return await self._relay(request, "POST", "/cancel")

    async def _relay(self, request: web.Request, method: str, suffix: str) -> web.StreamResponse:
        response_id = request.match_info["response_id"]
        # One policy generation for the whole lookup.
        pool, replica, limits = await stored_home(
            self._limiter(), self._fleet(), self._memory.responses, request.headers, response_id
        )
        out = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
        out[headers.REQUEST_ID] = REQUEST_ID.get()
        out.update(headers.UNCOMPRESSED)
        url = f"{replica.url}/v1/responses/{response_id}{suffix}"
        started = time.perf_counter()
        status = 502
        try:
            async with request.app[SESSION].request(
                method, url, params=request.query, headers=out, timeout=_TIMEOUT
            ) as upstream:
                status = upstream.status
                relayed = {
                    "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                    **pinned_headers(pool, replica, limits),
                }
                if (encoding := upstream.headers.get("Content-Encoding")) is not None:
                    relayed["Content-Encoding"] = encoding  # the bytes are relayed as they came
                response = web.StreamResponse(status=upstream.status, headers=relayed)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            status = 502
            if request.writer.output_size > 0:
                raise  # mid-relay: the connection is cut, as any broken stream
            error = replica_unreachable(replica.name, exc)
            answered = {headers.REQUEST_ID: REQUEST_ID.get(), headers.POOL: pool.name, **limits}
            return error.response(answered)
        finally:
            self._metrics.requests.labels(pool.name, Route.PINNED, str(status)).inc()
            self._metrics.duration.labels(pool.name).observe(time.perf_counter() - started)


def add_routes(
    app: web.Application,
    fleet: Callable[[], Fleet],
    memory: RoutingMemory,
    metrics: GatewayMetrics,
    limiter: Callable[[], RateLimiter],
    expect: Callable[[web.Request], Awaitable[web.StreamResponse | None]],
) -> None:
    """The two routes, ``expect`` answering their Expect headers."""
    lookup = ResponseLookup(fleet, memory, metrics, limiter)

    async def session(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(auto_decompress=False) as client:
            app[SESSION] = client
            yield

    app.cleanup_ctx.append(session)
    app.router.add_get("/v1/responses/{response_id}", lookup.retrieve, expect_handler=expect)
    app.router.add_post("/v1/responses/{response_id}/cancel", lookup.cancel, expect_handler=expect)
