"""The picker's half of a request: what the Forwarder does for `serve` (gateway/proxy.py),
except that Envoy relays the bytes. It dispatches the request to a replica of its pool, names
that replica to Envoy, and follows the answer for what routing learns: the first byte (the
replica's prefill is done), the usage the replica reports, the end (its slot is free), and
its status for passive health.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from urllib.parse import urlsplit

from gateway import answers, headers
from gateway.errors import ApiError, no_healthy_replica, pool_saturated
from gateway.metrics import GatewayMetrics
from gateway.outlier import OutlierDetector
from gateway.picker.exchange import PickerExchange
from gateway.replica_state import Dispatch, ReplicaState
from gateway.routed import Outcome, Routed
from gateway.state import PoolSaturated
from gateway.usage import prompt_usage

_TAIL = 512
"""Bytes of the previous chunk kept for finding `usage` split across two."""


class Picker:
    def __init__(self, metrics: GatewayMetrics, outliers: OutlierDetector) -> None:
        self._metrics = metrics
        self._outliers = outliers
        self._addresses: dict[str, str] = {}

    async def forward(self, exchange: PickerExchange, routed: Routed) -> int:
        """Picks the replica and follows its answer; the status the answer ended with."""
        outcome = Outcome()
        try:
            await self._forward(exchange, routed, outcome)
        finally:
            pool = routed.pool.name
            self._metrics.answered(pool, outcome.route, outcome.status, routed.started)
        return outcome.status

    async def _forward(self, exchange: PickerExchange, routed: Routed, outcome: Outcome) -> None:
        pool = routed.pool
        exclude = routed.hooks.exclude(pool.replicas, [], 0) if routed.hooks is not None else ()
        error: ApiError | None = None
        try:
            dispatch = await pool.acquire(routed.features, exclude=exclude)
        except PoolSaturated as saturated:
            dispatch, error = None, pool_saturated(saturated, pool.policy.queue_timeout_s)
        if dispatch is None:
            error = error or no_healthy_replica(pool.name)
            outcome.status = error.status
            await exchange.refuse(error)
            return
        try:
            outcome.route = (routed.route or dispatch.decision.route).value
            answer_headers = {
                **routed.extra_headers,
                headers.REQUEST_ID: routed.request_id,
                headers.POOL: pool.name,
                headers.REPLICA: dispatch.replica.name,
                headers.ROUTE: outcome.route,
            }
            await exchange.pick(await self._address(dispatch.replica), answer_headers)
            outcome.status = await self._follow(exchange, routed, dispatch)
        finally:
            pool.end(dispatch)

    async def _follow(self, exchange: PickerExchange, routed: Routed, dispatch: Dispatch) -> int:
        answer = _Answer(self._metrics, self._outliers, routed, dispatch)
        status = await exchange.follow(answer.began, answer.chunk)
        if 0 < status < 500:
            self._outliers.success(dispatch.replica)
        return status

    async def _address(self, replica: ReplicaState) -> str:
        """The replica as Envoy's override_host reads it: ip:port (a name resolved once)."""
        address = self._addresses.get(replica.url)
        if address is None:
            parts = urlsplit(replica.url)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
                ip = ipaddress.ip_address(infos[0][4][0])
            address = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
            self._addresses[replica.url] = address
        return address


class _Answer:
    """What the picker learns from an answer Envoy relays, as the proxy learns it from the
    bytes it relays itself."""

    def __init__(
        self, metrics: GatewayMetrics, outliers: OutlierDetector, routed: Routed, dispatch: Dispatch
    ) -> None:
        self._metrics = metrics
        self._outliers = outliers
        self._routed = routed
        self._dispatch = dispatch
        self._watch = routed.hooks.answered if routed.hooks is not None else None
        self._status = 0
        self._stream = False
        self._tail = b""

    def began(self, status: int, content_type: str) -> None:
        self._status = status
        self._stream = content_type.startswith(answers.SSE) and status < 400
        if status >= 500:
            pool, replica = self._routed.pool, self._dispatch.replica
            self._outliers.failure(pool, replica, f"HTTP {status}", time.monotonic())

    def chunk(self, chunk: bytes) -> None:
        routed, dispatch = self._routed, self._dispatch
        pool = routed.pool
        if self._stream and dispatch.pending:
            self._metrics.ttft_of(pool.name).observe(time.perf_counter() - routed.started)
            pool.first_byte(dispatch, time.monotonic() - dispatch.at)
        if self._watch is not None and not self._watch(dispatch.replica.name, self._status, chunk):
            self._watch = None
        seen = self._tail + chunk
        usage = prompt_usage(seen)
        if usage is not None:
            pool.observe_usage(dispatch, usage)
            if routed.on_usage is not None:
                routed.on_usage(seen)
            seen = b""  # counted once
        self._tail = seen[-_TAIL:]
