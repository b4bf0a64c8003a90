"""The picker's half of a request: what the Forwarder does for `serve` (gateway/relay/proxy.py),
except that Envoy relays the bytes. It dispatches the request to a replica of its pool, names
that replica to Envoy, and follows the answer for what routing learns: the first byte (the
replica's prefill is done), the usage the replica reports, the end (its slot is free), and
its status for passive health. A stored response's lookup it names to the replica holding the
response, as gateway/http/responses_lookup.py relays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Collection, Iterable, Mapping
from urllib.parse import urlsplit

from gateway import headers
from gateway.fleet.outlier import OutlierDetector
from gateway.fleet.pools import PoolSaturated, PoolState
from gateway.fleet.replicas import Dispatch, ReplicaState
from gateway.http.errors import (
    ApiError,
    WithHeaders,
    no_healthy_replica,
    pool_saturated,
    replica_unreachable,
    stored_response_unavailable,
)
from gateway.http.request_body import Endpoint
from gateway.picker.envoy_config import FALLBACKS, SERVED
from gateway.picker.exchange import PickerExchange
from gateway.relay import answers
from gateway.relay.stream_usage import UsageDropped, asking_usage
from gateway.relay.usage import UsageReads
from gateway.routing.routed import CLIENT_CLOSED, STREAM_FAILED, Outcome, Routed
from gateway.telemetry.metrics import GatewayMetrics
from router_policies.decision import Decision, Route

_MARKED_ENDS = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES))
"""The streams whose end shows in their bytes (`data: [DONE]`, a Responses stream's final
event): only these are known to have reached the client whole."""
ADDRESS_TTL_S = 10.0
"""How long a replica's resolved address is reused. A StatefulSet pod that restarts keeps its
name and gets a new IP, which Envoy's endpoints (an InferencePool's, a STRICT_DNS cluster's)
follow within seconds; an address kept for good would name a pod that is gone."""


class Picker:
    def __init__(
        self, metrics: GatewayMetrics, outliers: OutlierDetector, *, stream_usage: bool = True
    ) -> None:
        self._metrics = metrics
        self._outliers = outliers
        self._addresses = Addresses()
        self._stream_usage = stream_usage
        """Ask for a stream's usage the client did not ask for (gateway/relay/stream_usage.py)."""

    async def forward(self, exchange: PickerExchange, routed: Routed) -> int:
        """Picks the replica and follows its answer; the status the answer went out with (a
        stream that failed midway: its 200, as `serve` says, which the limits charge)."""
        outcome = Outcome()
        try:
            await self._forward(exchange, routed, outcome)
        finally:
            pool = routed.pool.name
            self._metrics.answered(pool, outcome.route, outcome.status, routed.started)
        return outcome.wire

    async def _forward(self, exchange: PickerExchange, routed: Routed, outcome: Outcome) -> None:
        pool, hooks = routed.pool, routed.hooks
        outside = []
        if exchange.subset is not None:
            outside = await self._outside(pool.replicas.values(), exchange.subset)
        exclude = [*(hooks.exclude(pool.replicas, [], 0) if hooks is not None else []), *outside]
        # Envoy's tries after the first are `serve`'s retries: kept to what every try must keep
        # to (a stored response's replica, the replicas listing an adapter), not to the first
        # try's preference (an adapter's warm replicas), which would leave none.
        retry = [*(hooks.exclude(pool.replicas, [], 1) if hooks is not None else []), *outside]
        error: ApiError | None = None
        try:
            dispatch = await pool.acquire(routed.features, exclude=exclude)
        except PoolSaturated as saturated:
            dispatch, error = None, pool_saturated(saturated, pool.policy.queue_timeout_s)
        if dispatch is None:
            error = error or no_healthy_replica(pool.name)
            outcome.status = outcome.wire = error.status
            await exchange.refuse(WithHeaders(error, routed.refusal_headers()))  # as serve's
            return
        answer = _Answer(self._metrics, self._outliers, routed, dispatch)
        try:
            answer_headers = routed.answer_headers(dispatch.replica.name, dispatch.decision.route)
            outcome.route = answer_headers[headers.ROUTE]
            fallbacks = _fallbacks(
                pool.replicas.values(), dispatch.replica, retry, time.monotonic()
            )
            try:
                answer.by_address = {
                    await self._addresses.of(dispatch.replica.url): dispatch.replica
                }
            except OSError as exc:  # a name that has never resolved: no address to name
                error = replica_unreachable(dispatch.replica.name, exc)
                outcome.status = outcome.wire = error.status
                await exchange.refuse(WithHeaders(error, routed.refusal_headers()))
                return
            routed.dispatched()  # only now: a replica with no address was never sent it
            for fallback in fallbacks:
                with contextlib.suppress(OSError):  # Envoy tries those that resolve
                    address = await self._addresses.of(fallback.url)
                    answer.by_address.setdefault(address, fallback)
            asked = asking_usage(routed.parsed) if self._stream_usage else None
            # What `serve` sends: the parsed body is the decoded one, its model a tier's pool's
            # (the exchange sends it in place of Envoy's where the two differ).
            body = asked if asked is not None else routed.parsed.raw
            # As many as Envoy's retries, the chosen replica again where the pool has too few
            # others: past the list Envoy's fallback policy picks from every pool's replicas.
            endpoints = list(answer.by_address)
            endpoints += endpoints[:1] * (1 + FALLBACKS - len(endpoints))
            await exchange.pick(endpoints, answer_headers, body)
            shown = UsageDropped() if asked is not None else None

            finished = False

            def ended(status: int) -> None:
                nonlocal finished
                finished = True
                if status == CLIENT_CLOSED and answer.whole:
                    # The client had all of it and closed before the answer's formal end (the
                    # sync OpenAI SDK leaves at `data: [DONE]`): the replica's answer stands.
                    status = answer.status
                outcome.wire = status
                if 0 < status < 400 and (why := answer.stream_failure) is not None:
                    status = STREAM_FAILED  # as `serve` counts it; Envoy relayed it as it came
                    self._outliers.failure(pool, answer.dispatch.replica, why, time.monotonic())
                elif 0 < status < 400 and answer.refusal_status is not None:
                    status = answer.refusal_status  # the request's fault, as `serve` counts it
                outcome.status = status
                # A client that left says nothing of the replica (one hanging in its prefill
                # sees every client leave): as `serve`, only an answer had whole is a success.
                if 0 < status < 500 and status != CLIENT_CLOSED:
                    self._outliers.success(answer.dispatch.replica)

            try:
                await exchange.follow(answer.began, answer.chunk, ended, shown)
            except asyncio.CancelledError:
                if not finished:  # Envoy may end the stream by cancelling it: as on its end
                    ended(CLIENT_CLOSED)
                raise
        finally:
            pool.end(answer.dispatch)  # the fallback's, where one served

    async def pin(
        self,
        exchange: PickerExchange,
        pool: PoolState,
        replica: ReplicaState,
        answer_headers: Mapping[str, str],
        started: float,
    ) -> None:
        """A stored response's lookup: to ``replica``, which holds the response, on each try
        Envoy makes (it retries a failure before the answer's headers; another replica would
        answer that it has no such response), and counted as `serve` counts it, pinned. No
        slot is taken and no health is judged, as `serve`'s relay of it does neither."""
        try:
            address = await self._addresses.of(replica.url)
        except OSError as exc:
            raise replica_unreachable(replica.name, exc) from None
        if exchange.subset is not None and address not in exchange.subset:
            raise stored_response_unavailable(
                f"The replica that holds the response, {replica.name}, is not among the "
                "endpoints the proxy allows for this request.",
                "response_id",
            )
        status = CLIENT_CLOSED

        def ended(end: int) -> None:
            nonlocal status
            status = end

        await exchange.pin([address] * (1 + FALLBACKS), answer_headers)
        try:
            await exchange.follow(lambda *_: {}, lambda _: None, ended)
        finally:
            self._metrics.answered(pool.name, Route.PINNED, status, started)

    async def _outside(
        self, replicas: Iterable[ReplicaState], subset: Collection[str]
    ) -> list[str]:
        """The replicas the proxy's subset leaves out (all of them for an empty subset: the
        pool then has no replica for the request, a 503, as the protocol asks)."""
        out = []
        for replica in replicas:
            try:
                address = await self._addresses.of(replica.url)
            except OSError:
                address = ""  # never resolved: not an address the proxy could have named
            if address not in subset:
                out.append(replica.name)
        return out


class Addresses:
    """Replicas as Envoy's override_host reads them: ip:port, a name resolved again after
    ADDRESS_TTL_S; while it does not resolve, the last address stands."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, float]] = {}

    async def of(self, url: str) -> str:
        now = time.monotonic()
        known = self._known.get(url)
        if known is not None and now - known[1] < ADDRESS_TTL_S:
            return known[0]
        try:
            address = await _resolve(url)
        except OSError:
            if known is None:
                raise
            address = known[0]
        self._known[url] = (address, now)
        return address


async def _resolve(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        ip = ipaddress.ip_address(infos[0][4][0])
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _fallbacks(
    replicas: Iterable[ReplicaState], chosen: ReplicaState, exclude: Collection[str], now: float
) -> list[ReplicaState]:
    """Where Envoy retries a request whose replica failed before its first byte: the least
    busy of the pool's other available replicas (``exclude``: names it must not go to)."""
    others = [r for r in replicas if r is not chosen and r.name not in exclude and r.available(now)]
    return sorted(others, key=lambda r: r.inflight + r.remote_inflight)[:FALLBACKS]


class _Answer:
    """What the picker learns from an answer Envoy relays, as the proxy learns it from the
    bytes it relays itself."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        outliers: OutlierDetector,
        routed: Routed,
        dispatch: Dispatch,
    ) -> None:
        self._metrics = metrics
        self._outliers = outliers
        self._routed = routed
        self.by_address: Mapping[str, ReplicaState] = {}
        """The replicas the pick named, by the address Envoy reports as the one that served."""
        self.dispatch = dispatch
        """The attempt whose answer this is: on a fallback when the picked replica failed."""
        self._moved = False
        self._watch = routed.hooks.answered if routed.hooks is not None else None
        self.status = 0
        self._stream = False
        self._waiting = True
        """For the stream's first token: its time is the TTFT and the prefill's end."""
        self._usage = UsageReads(lambda seen: routed.learn_usage(self.dispatch, seen))
        self._raw = False
        self._end: answers.StreamEnd | None = None
        """Where the stream is: whether its end marker went by (a stream of an endpoint that
        has one)."""
        self._length: int | None = None
        self._relayed = 0
        """Bytes of the answer's body Envoy was let relay."""

    def began(self, status: int, sent: Mapping[str, str]) -> Mapping[str, str]:
        """Takes the answer's status and headers; the answer headers that change (the
        replica, when a fallback served)."""
        self.status = status
        self._stream = sent.get("content-type", "").startswith(answers.SSE) and status < 400
        endpoint = self._routed.parsed.endpoint
        # Compressed (a client's Accept-Encoding reaches the replica): no event can be read.
        self._raw = "content-encoding" in sent
        if self._stream and endpoint in _MARKED_ENDS:
            self._end = answers.StreamEnd(endpoint, self._raw)
        length = sent.get("content-length", "")
        self._length = int(length) if length.isdigit() else None
        served = sent.get(SERVED, "")
        pool, now = self._routed.pool, time.monotonic()
        changed: dict[str, str] = {}
        fallback = self.by_address.get(served)
        if fallback is not None and fallback is not self.dispatch.replica:
            # Envoy retried it: the picked replica failed before its first byte.
            self._outliers.failure(pool, self.dispatch.replica, "failed before its first byte", now)
            self._move(fallback)
            changed[headers.REPLICA] = fallback.name
        if status >= 500:
            self._outliers.failure(pool, self.dispatch.replica, f"HTTP {status}", now)
        self.dispatch.refused = self.dispatch.rejected = 400 <= status < 500  # as `serve`
        return changed

    def _move(self, fallback: ReplicaState) -> None:
        """The request is the fallback's from here on: in flight there, not on the replica that
        failed, and its usage judged against what the fallback was predicted to hold."""
        pool, features = self._routed.pool, self.dispatch.request
        pool.end(self.dispatch)
        others = [name for name in pool.replicas if name != fallback.name]
        decision = pool.decide(features, others) or Decision(fallback.name, Route.LEAST_LOADED)
        self.dispatch = pool.begin(decision, features, retry=True)
        self._moved = True
        self._metrics.retries.labels(pool.name).inc()  # as `serve` counts its own retries

    @property
    def whole(self) -> bool:
        """Whether all of the answer went by: a stream through its end marker, a body through
        its length (one without either is never known whole)."""
        if self._end is not None:
            return self._end.ended
        return not self._stream and self._length is not None and self._relayed >= self._length

    @property
    def refusal_status(self) -> int | None:
        """The 4xx code of vLLM's error event in the stream, where it says the request is at
        fault."""
        return self._end.refusal_status if self._end is not None else None

    @property
    def stream_failure(self) -> str | None:
        """Why a stream that closed cleanly failed all the same: it closed before its end
        marker, or carried vLLM's error event. None where neither (or it is not a stream)."""
        end = self._end
        if end is None:
            return None
        if not end.ended:
            return "stream cut short"
        # A 4xx in the event is the request's fault (a schema vLLM cannot compile): not the
        # replica's failure.
        return "error event in its stream" if end.errored and not end.refused else None

    def chunk(self, chunk: bytes) -> None:
        routed, dispatch = self._routed, self.dispatch
        pool = routed.pool
        self._relayed += len(chunk)
        if self._end is not None:
            self._end.feed(chunk)
        if (
            self._stream
            and self._waiting
            and (self._raw or answers.has_first_token(routed.parsed.endpoint, chunk))
        ):
            self._waiting = False
            self._metrics.ttft_of(pool.name).observe(time.perf_counter() - routed.started)
            if not self._moved:  # a fallback's wait began before it was known: no rate in it
                pool.first_byte(dispatch, time.monotonic() - dispatch.at)
        if self._watch is not None and not self._watch(dispatch.replica.name, self.status, chunk):
            self._watch = None
        self._usage(chunk)
