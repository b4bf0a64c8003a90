"""Forwarding a request to a replica: retries before the first byte, then a byte-for-byte relay.

An attempt fails, and moves to another replica, on anything that happens before the client has
received a byte: a refused connection, a 5xx answer, a stream that ends or stalls before its
first chunk (`first_token_timeout_s`), a non-streaming answer that breaks while held back (not
one past `answer_timeout_s`: most likely still being generated, a 504, not rerun elsewhere). Each
outcome also feeds the replica's passive health (gateway/fleet/outlier.py): an answer is a
success once it was read whole. After the first byte a failure can only be reported in-band: a
stream ends with an SSE error event. TCP_NODELAY is on for both sides: the event loop (uvloop or
asyncio) sets it on every TCP transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway import headers
from gateway.fleet.outlier import OutlierDetector
from gateway.fleet.pools import PoolSaturated, PoolState
from gateway.fleet.replicas import Dispatch, ReplicaState
from gateway.http.errors import (
    ApiError,
    answer_broke,
    answer_timed_out,
    answer_unrelayable,
    no_healthy_replica,
    not_openai,
    pool_saturated,
    shutdown_event,
    shutting_down,
    sse_error,
    upstream_error,
)
from gateway.http.exchange import Exchange, end_with
from gateway.relay import answers, stream_usage, usage
from gateway.relay.upstream import UpstreamResponse, Upstreams
from gateway.relay.upstream_errors import (
    ReadTimeout,
    ReplicaUnreachable,
    StreamRefused,
    UpstreamError,
    failure_reason,
)
from gateway.routing.routed import CLIENT_CLOSED, STREAM_FAILED, Failure, Forwarding, Routed
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger(__name__)

# The replica sees the client's credentials (vLLM's --api-key) and trace context, nothing else:
# hop-by-hop and gateway-specific headers stay here.
_FORWARDED_REQUEST_HEADERS = ("Authorization", "traceparent", "tracestate", "Accept")
SHUTTING_DOWN = 503
"""Status recorded for a request the drain deadline ended."""
_UNBOUNDED: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()


class Forwarder:
    def __init__(
        self,
        upstreams: Upstreams,
        settings: Settings,
        metrics: GatewayMetrics,
        outliers: OutlierDetector,
    ) -> None:
        self._upstreams = upstreams
        self._settings = settings
        self._metrics = metrics
        self._outliers = outliers
        self.closing = False
        """Set at the drain deadline, just before the requests still in flight are cancelled:
        they end with an error the client can read rather than a cut connection."""

    async def forward(self, exchange: Exchange, routed: Routed) -> int:
        """Answers the request through ``exchange``; the status its answer went out with."""
        asked = stream_usage.asking_usage(routed.parsed) if self._settings.stream_usage else None
        req = Forwarding(exchange, routed, asked or routed.parsed.raw, asked is not None)
        outcome = req.outcome
        try:
            return await self._forward(req)
        except asyncio.CancelledError:
            if not self.closing:
                raise  # the client left: there is no one to answer
            if (task := asyncio.current_task()) is not None:
                task.uncancel()
            outcome.status = SHUTTING_DOWN
            if exchange.started:
                return outcome.wire  # a stream, already ended with an error event
            return await _refuse(req, routed.refusal_headers(), shutting_down())  # as any refusal
        finally:
            self._metrics.answered(routed.pool.name, outcome.route, outcome.status, routed.started)
            log.debug(
                "answered %d from pool %s, route %s, in %.1f ms", outcome.status,
                routed.pool.name, outcome.route, (time.perf_counter() - routed.started) * 1e3,
            )  # fmt: skip

    async def _forward(self, req: Forwarding) -> int:
        exchange, routed, outcome = req.exchange, req.routed, req.outcome
        pool = routed.pool
        # Relayed bytes are never re-encoded: ask for plain ones (replicas are near, and the
        # usage figures routing learns from are read from the relayed bytes).
        out = [
            ("Content-Type", "application/json"),
            (headers.REQUEST_ID, routed.request_id),
            *headers.UNCOMPRESSED.items(),
        ]
        sent = exchange.headers
        out += [(name, sent[name]) for name in _FORWARDED_REQUEST_HEADERS if name in sent]
        tried: list[str] = []
        failed: tuple[Failure, Dispatch] | None = None
        for attempt in range(self._settings.retries + 1):
            try:
                skip = tried
                if routed.hooks is not None:
                    skip = routed.hooks.exclude(pool.replicas, tried, attempt)
                dispatch = await self._acquire(pool, routed, skip, attempt)
            except PoolSaturated as saturated:
                error = pool_saturated(saturated, pool.policy.queue_timeout_s)
                return await _refuse(req, routed.refusal_headers(), error)
            if dispatch is None:
                break
            routed.dispatched()
            # Counted under the route it took however it ends: answered, failed, or left by
            # its client before the answer.
            outcome.route = routed.resolution.answer_route(dispatch.decision.route).value
            if attempt:
                self._metrics.retries.labels(pool.name).inc()
            tried.append(dispatch.replica.name)
            try:
                last = attempt == self._settings.retries
                result = await self._attempt(req, dispatch, out, last)
            finally:
                # Also on cancellation (the client left while the replica was still silent).
                pool.end(dispatch)
            if not isinstance(result, Failure):
                return result
            failed = result, dispatch
            if result.final:
                break
        return await self._give_up(req, failed)

    async def _acquire(
        self, pool: PoolState, routed: Routed, skip: list[str], attempt: int
    ) -> Dispatch | None:
        return await pool.acquire(routed.features, exclude=skip, retry=attempt > 0)

    async def _attempt(
        self, req: Forwarding, dispatch: Dispatch, out: list[tuple[str, str]], last: bool
    ) -> int | Failure:
        """One replica's try: the relayed answer's status, or a failure before the first
        byte. ``out``: the headers it sends."""
        routed, replica = req.routed, dispatch.replica
        stream = routed.parsed.stream
        upstream: UpstreamResponse | None = None
        first = b""
        settings = self._settings
        try:
            # Not streamed: no context (its getpid() per request); the head's timer bounds it.
            deadline = asyncio.timeout(settings.first_token_timeout_s) if stream else _UNBOUNDED
            async with deadline:
                path, wait = routed.parsed.endpoint.value, settings.answer_timeout_s
                upstream = await self._upstreams.post(replica.url, path, req.body, out, wait)
                if upstream.content_type == answers.SSE and upstream.status < 400:
                    first = await answers.first_output(upstream, routed.parsed)
        except (UpstreamError, TimeoutError, StreamRefused) as exc:
            if upstream is not None:
                upstream.close()
            if isinstance(exc, StreamRefused):  # the request's fault: as vLLM said, not retried
                dispatch.refused = True
                return Failure(exc.status, exc.body, answers.JSON, final=True)
            if not stream and isinstance(exc, ReadTimeout):
                return await self._timed_out(req, dispatch)
            if isinstance(exc, ReplicaUnreachable):
                replica.mark_down()
            reason = failure_reason(exc, stream)
            self._failed(routed.pool, replica, reason)
            log.warning("replica %s failed before the first byte: %s", replica.name, reason)
            return Failure(502, upstream_error(replica.name, exc), "application/json")
        except BaseException:
            if upstream is not None:
                upstream.close()  # vLLM aborts the request and frees its KV cache
            raise
        if not answers.from_vllm(upstream.content_type):
            # Not vLLM's answer (a proxy's error page, a misrouted port): a failure, never relayed.
            kind = upstream.content_type or "no content type"
            upstream.close()
            self._failed(routed.pool, replica, f"answered {kind}")
            log.warning("replica %s answered %s, not JSON or SSE", replica.name, kind)
            return Failure(502, not_openai(replica.name, kind), answers.JSON)
        if upstream.status >= 500:
            self._failed(routed.pool, replica, f"HTTP {upstream.status}")
            if not last:
                log.warning("replica %s answered %d", replica.name, upstream.status)
                body = await answers.drain(upstream)
                if body is None:
                    return Failure(upstream.status, answer_unrelayable(replica.name), answers.JSON)
                return Failure(upstream.status, body, upstream.content_type)
        dispatch.refused = dispatch.rejected = 400 <= upstream.status < 500  # nothing stored
        try:
            return await self._relay(req, dispatch, upstream, first)
        except (UpstreamError, TimeoutError) as exc:
            reason = f"answer broke: {failure_reason(exc, False)}"
            if upstream.status < 500:  # a 5xx is counted already
                self._failed(routed.pool, replica, reason)
            if req.exchange.started:  # part of it is out: the client learns by the cut
                raise ConnectionResetError("the replica's answer broke off midway") from exc
            # A non-streaming answer is held back until whole: none of it reached the client.
            log.warning("replica %s failed before the first byte: %s", replica.name, reason)
            return Failure(502, answer_broke(replica.name, exc), answers.JSON)

    async def _timed_out(self, req: Forwarding, dispatch: Dispatch) -> int:
        """A non-streaming answer not in within its timeout: most likely still being generated,
        so neither retried (another replica would take as long) nor the replica's failure."""
        replica, waited = dispatch.replica.name, self._settings.answer_timeout_s
        log.warning("replica %s had not answered in %g s: request stopped", replica, waited)
        where = req.routed.answer_headers(replica, dispatch.decision.route)
        return await _refuse(req, where, answer_timed_out(replica, waited))

    def _failed(self, pool: PoolState, replica: ReplicaState, reason: str) -> None:
        self._outliers.failure(pool, replica, reason, time.monotonic())

    async def _give_up(self, req: Forwarding, failed: tuple[Failure, Dispatch] | None) -> int:
        """The last failed attempt's answer (naming its replica, as every proxied answer does),
        or 503 when no replica could be tried."""
        routed = req.routed
        if failed is None:
            error = no_healthy_replica(routed.pool.name)
            return await _refuse(req, routed.refusal_headers(), error)
        failure, dispatch = failed
        req.outcome.status = failure.status
        hdrs = routed.answer_headers(dispatch.replica.name, dispatch.decision.route)
        hdrs["Content-Type"] = failure.content_type
        await req.exchange.answer(failure.status, hdrs, failure.body)
        return failure.status

    async def _relay(
        self, req: Forwarding, dispatch: Dispatch, upstream: UpstreamResponse, first: bytes
    ) -> int:
        out = req.routed.answer_headers(dispatch.replica.name, dispatch.decision.route)
        out["Content-Type"] = upstream.content_type_header or answers.JSON
        encoding = upstream.content_encoding
        if encoding is not None:
            out["Content-Encoding"] = encoding  # the bytes are relayed as they came
        clean = False
        try:
            if first:
                clean = await self._relay_stream(req, dispatch, out, upstream, first)
            else:
                clean = await self._relay_body(req, dispatch, out, upstream)
            return req.outcome.wire
        finally:
            # On a client disconnect (the handler is cancelled) or any error, closing the
            # connection rather than returning it to the pool makes vLLM abort the request
            # and free its KV cache.
            if clean:
                upstream.release()
            else:
                upstream.close()

    async def _relay_body(
        self, req: Forwarding, dispatch: Dispatch, out: dict[str, str], upstream: UpstreamResponse
    ) -> bool:
        """Relays a non-streaming answer (gateway/relay/answers.py); True when it ended cleanly."""
        exchange, routed, outcome = req.exchange, req.routed, req.outcome
        replica = dispatch.replica.name
        body, whole = await answers.read_head(upstream, self._settings.max_buffered_answer_bytes)
        if routed.hooks is not None:
            routed.hooks.answered(replica, upstream.status, body)
        outcome.wire = upstream.status
        try:
            if whole:
                tail = body
                await exchange.answer(upstream.status, out, body)
            else:
                await exchange.start(upstream.status, out, body, upstream.content_length)
                del body
                tail = await answers.relay_rest(exchange, upstream)
                await exchange.end()
        except ConnectionResetError:
            return False  # the client left, noticed on a write: CLIENT_CLOSED, as if cancelled
        except (UpstreamError, TimeoutError) as exc:
            # Part of the body is out and JSON has no in-band error: the client learns of the
            # failure by the connection being cut short.
            log.warning("answer from %s broke midway: %r", replica, exc)
            outcome.status = STREAM_FAILED
            raise
        outcome.status = upstream.status  # only now: it reached the client whole
        if upstream.status < 500:
            self._outliers.success(dispatch.replica)  # only now: it was read whole
        routed.learn_usage(dispatch, tail)
        return True

    async def _relay_stream(
        self,
        req: Forwarding,
        dispatch: Dispatch,
        out: dict[str, str],
        upstream: UpstreamResponse,
        first: bytes,
    ) -> bool:
        """Relays chunk by chunk; True when the replica's stream ended cleanly."""
        exchange, routed, outcome = req.exchange, req.routed, req.outcome
        out["Cache-Control"] = "no-cache"
        outcome.wire = upstream.status
        clean = True
        watch = routed.hooks.answered if routed.hooks is not None else None
        endpoint = routed.parsed.endpoint
        waiting = True  # for the first token: its time is the TTFT and the prefill's end
        raw = upstream.content_encoding is not None  # compressed: no event can be read in it
        end = answers.StreamEnd(endpoint, raw)  # its end marker may come split over any reads
        learn = usage.UsageReads(lambda seen: routed.learn_usage(dispatch, seen))  # split too

        def note(chunk: bytes) -> None:
            """What routing learns from a chunk, once it is on its way to the client."""
            nonlocal watch, waiting
            end.feed(chunk)
            if waiting and (raw or answers.has_first_token(endpoint, chunk)):
                waiting = False
                self._metrics.ttft_of(routed.pool.name).observe(
                    time.perf_counter() - routed.started
                )
                routed.pool.first_byte(dispatch, time.monotonic() - dispatch.at)
            if watch is not None and not watch(dispatch.replica.name, upstream.status, chunk):
                watch = None
            learn(chunk)

        # The usage the gateway asked for is learned from, not shown to the client (where it
        # can be read: compressed, the stream goes as it came).
        shown = (
            stream_usage.UsageDropped()
            if req.asked_usage and not raw
            else stream_usage.WholeEvents(raw)
        )

        def relay(chunk: bytes) -> None:
            exchange.write_nowait(shown(chunk))
            note(chunk)

        try:
            await exchange.start(upstream.status, out, shown(first))
            note(first)
            try:
                if exchange.direct:
                    # Each chunk goes out from the replica connection's callback: no task
                    # wakes per chunk, and a full client socket stops the replica's reads.
                    exchange.throttle((upstream.pause, upstream.resume))
                    try:
                        await upstream.relay(relay)
                    finally:
                        exchange.throttle(None)
                else:
                    while chunk := await upstream.readany():
                        await exchange.write(shown(chunk))
                        note(chunk)
            except (UpstreamError, TimeoutError) as exc:
                if raw:  # no error event can be read in compressed bytes: the cut tells
                    outcome.status = STREAM_FAILED
                    raise
                log.warning("stream from %s broke midway: %r", out[headers.REPLICA], exc)
                self._failed(routed.pool, dispatch.replica, "stream broke")
                shown.rest()  # half an event, which no client could read: not sent
                await exchange.write(sse_error(exc))
                clean = False
            if clean and not end.ended:
                log.warning("stream from %s ended before its end", out[headers.REPLICA])
                self._failed(routed.pool, dispatch.replica, "stream cut short")
                shown.rest()
                await exchange.write(sse_error(ConnectionResetError("stream ended early")))
                clean = False
            elif clean and end.errored:  # relayed as it came: a failed request all the same
                if not end.refused:  # the request's fault: no other replica would serve it
                    self._failed(routed.pool, dispatch.replica, "error event in its stream")
                clean = False
            elif clean:
                self._outliers.success(dispatch.replica)
            if tail := shown.rest():  # the last event, sent without its blank line
                await exchange.write(tail)
            await exchange.end()
        except asyncio.CancelledError:
            if self.closing:
                await end_with(exchange, shutdown_event())
            elif clean and end.ended:  # it had all of it (the sync SDK leaves at [DONE])
                outcome.status = upstream.status
            raise
        except ConnectionResetError:  # the client left, noticed on a write; whole: as above
            outcome.status = upstream.status if clean and end.ended else CLIENT_CLOSED
            return False
        # A 4xx error event is the request's own status, as it would have been before its start.
        outcome.status = upstream.status if clean else end.refusal_status or STREAM_FAILED
        return clean


async def _refuse(req: Forwarding, hdrs: dict[str, str], error: ApiError) -> int:
    """Answers ``error`` as the request's outcome; its status."""
    req.outcome.status = error.status
    await req.exchange.answer(error.status, error.answer_headers(hdrs), error.body())
    return error.status
