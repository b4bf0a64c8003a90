"""Forwarding a request to a replica: retries before the first byte, then a byte-for-byte relay.

TCP_NODELAY is on for both sides: aiohttp sets it on every server and client connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import Counter, Histogram

from gateway import headers
from gateway.errors import ApiError, error_body, no_healthy_replica, pool_saturated
from gateway.metrics import GatewayMetrics
from gateway.request_body import ParsedRequest
from gateway.settings import Settings
from gateway.state import Dispatch, PoolSaturated, PoolState, ReplicaState
from gateway.usage import prompt_usage
from router_policies.decision import Route
from router_policies.fingerprint import RequestFeatures

log = logging.getLogger(__name__)

# The replica sees the client's credentials (vLLM's --api-key) and trace context, nothing else:
# hop-by-hop and gateway-specific headers stay here.
_FORWARDED_REQUEST_HEADERS = ("Authorization", "traceparent", "tracestate", "Accept")
_SSE = "text/event-stream"
CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away first (nginx's convention)."""


@dataclass(frozen=True, slots=True)
class Routed:
    """A request with its pool and features, ready to forward."""

    parsed: ParsedRequest
    pool: PoolState
    features: RequestFeatures
    request_id: str
    started: float
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    """Headers the response carries besides the routing ones (e.g. the tier)."""
    route: Route | None = None
    """Overrides the replica decision's route in x-gateway-route (e.g. overflow)."""


@dataclass(slots=True)
class _Failure:
    status: int
    body: bytes
    content_type: str


class Forwarder:
    def __init__(
        self, session: aiohttp.ClientSession, settings: Settings, metrics: GatewayMetrics
    ) -> None:
        self._session = session
        self._settings = settings
        self._metrics = metrics
        self._recorders: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._ttft: dict[str, Histogram] = {}
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=settings.connect_timeout_s,
            sock_read=settings.first_byte_timeout_s,
        )

    async def forward(self, request: web.Request, routed: Routed) -> web.StreamResponse:
        pool = routed.pool
        out = CIMultiDict({"Content-Type": "application/json", "X-Request-Id": routed.request_id})
        for name in _FORWARDED_REQUEST_HEADERS:
            if name in request.headers:
                out[name] = request.headers[name]
        tried: list[str] = []
        failure: _Failure | None = None
        for attempt in range(self._settings.retries + 1):
            try:
                dispatch = await pool.acquire(routed.features, exclude=tried, retry=attempt > 0)
            except PoolSaturated:
                error = pool_saturated(pool.name, pool.policy.queue_timeout_s)
                self._record(pool.name, "none", error.status, routed.started)
                return error.response({headers.REQUEST_ID: routed.request_id})
            if dispatch is None:
                break
            replica = dispatch.replica
            if attempt:
                self._metrics.retries.labels(pool.name).inc()
            tried.append(replica.name)
            try:
                last = attempt == self._settings.retries
                outcome = await self._attempt(request, routed, dispatch, out, last)
            finally:
                # Also on cancellation (the client left while the replica was still silent).
                pool.end(dispatch)
            if isinstance(outcome, _Failure):
                failure = outcome
                continue
            return outcome
        return self._give_up(routed, failure)

    async def _attempt(
        self,
        request: web.Request,
        routed: Routed,
        dispatch: Dispatch,
        out: CIMultiDict[str],
        last: bool,
    ) -> web.StreamResponse | _Failure:
        """One replica's try: the relayed response, or a failure before the first byte."""
        replica = dispatch.replica
        try:
            upstream = await self._session.post(
                f"{replica.url}{routed.parsed.endpoint.value}",
                data=routed.parsed.raw,
                headers=out,
                timeout=self._timeout,
                compress=None,
                auto_decompress=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                replica.mark_down()
            log.warning("replica %s failed before the first byte: %r", replica.name, exc)
            return _Failure(502, _upstream_error(replica, exc), "application/json")
        if upstream.status >= 500 and not last:
            log.warning("replica %s answered %d; retrying", replica.name, upstream.status)
            return _Failure(upstream.status, await _drain(upstream), upstream.content_type)
        return await self._relay(request, routed, dispatch, upstream)

    def _give_up(self, routed: Routed, failure: _Failure | None) -> web.Response:
        pool = routed.pool
        hdrs = {headers.REQUEST_ID: routed.request_id, headers.POOL: pool.name}
        if failure is None:
            error = no_healthy_replica(pool.name)
            self._record(pool.name, "none", error.status, routed.started)
            return error.response(hdrs)
        self._record(pool.name, "none", failure.status, routed.started)
        return web.Response(
            status=failure.status, body=failure.body, content_type=failure.content_type,
            headers=hdrs,
        )  # fmt: skip

    async def _relay(
        self,
        request: web.Request,
        routed: Routed,
        dispatch: Dispatch,
        upstream: aiohttp.ClientResponse,
    ) -> web.StreamResponse:
        replica = dispatch.replica
        route = (routed.route or dispatch.decision.route).value
        out = {
            **routed.extra_headers,
            headers.REQUEST_ID: routed.request_id,
            headers.POOL: routed.pool.name,
            headers.REPLICA: replica.name,
            headers.ROUTE: route,
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
        }
        response: web.StreamResponse | None = None
        try:
            if upstream.content_type == _SSE:
                response = await self._relay_stream(request, routed, dispatch, out, upstream)
            else:
                response = await self._relay_body(routed, dispatch, out, upstream)
            return response
        finally:
            # On a client disconnect (the handler is cancelled) or any error, closing the
            # connection rather than returning it to the pool makes vLLM abort the request
            # and free its KV cache.
            if response is None:
                upstream.close()
            else:
                upstream.release()
            status = response.status if response is not None else CLIENT_CLOSED
            self._record(routed.pool.name, route, status, routed.started)

    @staticmethod
    async def _relay_body(
        routed: Routed, dispatch: Dispatch, out: dict[str, str], upstream: aiohttp.ClientResponse
    ) -> web.Response:
        try:
            body = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = ApiError(
                502, f"The replica failed while answering: {type(exc).__name__}.",
                type_="server_error", code="upstream_error",
            )  # fmt: skip
            return error.response(out)
        usage = prompt_usage(body)
        if usage is not None:
            routed.pool.observe_usage(dispatch, usage)
        return web.Response(status=upstream.status, body=body, headers=out)

    async def _relay_stream(
        self,
        request: web.Request,
        routed: Routed,
        dispatch: Dispatch,
        out: dict[str, str],
        upstream: aiohttp.ClientResponse,
    ) -> web.StreamResponse:
        response = _StreamWithFirstChunk(status=upstream.status, headers=out)
        response.headers["Cache-Control"] = "no-cache"
        await response.prepare(request)
        content = upstream.content
        first = True
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning(
                    "stream from %s broke after the first byte: %r", out[headers.REPLICA], exc
                )
                await response.write(_sse_error(exc))
                break
            if not chunk:
                break
            await response.write(chunk)
            if first:
                first = False
                self._ttft_of(routed.pool.name).observe(time.perf_counter() - routed.started)
                routed.pool.first_byte(dispatch, time.monotonic() - dispatch.at)
            usage = prompt_usage(chunk)
            if usage is not None:
                routed.pool.observe_usage(dispatch, usage)
        await response.write_eof()
        return response

    def _record(self, pool: str, route: str, status: int, started: float) -> None:
        # Labelled children are looked up once per label set: .labels() costs microseconds.
        key = (pool, route, status)
        recorder = self._recorders.get(key)
        if recorder is None:
            metrics = self._metrics
            recorder = (
                metrics.requests.labels(pool, route, str(status)),
                metrics.duration.labels(pool),
            )
            self._recorders[key] = recorder
        requests, duration = recorder
        requests.inc()
        duration.observe(time.perf_counter() - started)

    def _ttft_of(self, pool: str) -> Histogram:
        histogram = self._ttft.get(pool)
        if histogram is None:
            histogram = self._ttft[pool] = self._metrics.ttft.labels(pool)
        return histogram


class _StreamWithFirstChunk(web.StreamResponse):
    """Sends the headers together with the first chunk rather than in a packet of their own,
    as aiohttp's own web.Response does: one write fewer before the first token."""

    _send_headers_immediately = False


def _upstream_error(replica: ReplicaState, exc: BaseException) -> bytes:
    return error_body(
        f"Replica {replica.name} could not be reached: {type(exc).__name__}.",
        "server_error",
        "upstream_unavailable",
    )


def _sse_error(exc: BaseException) -> bytes:
    # The stream already has a 200 status: the failure can only be reported in-band. The
    # OpenAI SDKs raise on an event carrying an "error" object.
    body = error_body(
        f"The replica failed mid-stream: {type(exc).__name__}.", "server_error", "upstream_error"
    )
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


async def _drain(upstream: aiohttp.ClientResponse) -> bytes:
    """The body of a failed attempt, kept in case no other replica can take the request."""
    try:
        return await upstream.read()
    except (aiohttp.ClientError, TimeoutError):
        return b""
    finally:
        upstream.release()
