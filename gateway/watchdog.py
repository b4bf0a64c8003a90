"""The parent of `serve --workers N` watching its workers' event loops.

A worker that is stopped (SIGSTOP) or wedged (a loop that never yields) keeps its listening
socket: SO_REUSEPORT goes on handing it its share of new connections, and none is answered.
Each worker's event loop therefore writes a heartbeat every ``BEAT_S`` into a page shared with
the parent (mapped before the fork); the parent kills a worker silent for longer than
``worker_stuck_s`` (its socket closes with it, so the kernel stops choosing it) and starts
another in its place, as for a crash. The same page counts the workers replaced, which every
worker exposes as ``gateway_workers_replaced_total``.
"""

from __future__ import annotations

import asyncio
import mmap
import struct
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.telemetry.metrics import WORKERS_REPLACED

BEAT_S = 0.5
"""How often a worker's event loop writes its heartbeat."""
STARTUP_GRACE_S = 30.0
"""A new worker's first heartbeat may come this late: it loads the policy and builds its
app (a learned tier classifier included) before its loop runs."""
HUNG, CRASHED = "hung", "crashed"
_REASONS = (HUNG, CRASHED)
_SLOT = struct.Struct("d")


class Heartbeats:
    """Each worker's last heartbeat (CLOCK_MONOTONIC, the same for every process), and the
    workers the parent replaced, by reason."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        # Anonymous and shared: the forked workers write the parent's very pages.
        self._page = mmap.mmap(-1, _SLOT.size * (workers + len(_REASONS)))

    def beat(self, index: int, at: float | None = None) -> None:
        _SLOT.pack_into(self._page, _SLOT.size * index, time.monotonic() if at is None else at)

    def starting(self, index: int) -> None:
        """A worker is being started in this place: its first beat is due by the grace."""
        self.beat(index, time.monotonic() + STARTUP_GRACE_S)

    def silent_s(self, index: int) -> float:
        last: float = _SLOT.unpack_from(self._page, _SLOT.size * index)[0]
        return time.monotonic() - last

    def replaced(self, reason: str) -> None:
        offset = _SLOT.size * (self.workers + _REASONS.index(reason))
        _SLOT.pack_into(self._page, offset, _SLOT.unpack_from(self._page, offset)[0] + 1)

    def replacements(self) -> dict[str, float]:
        return {
            reason: _SLOT.unpack_from(self._page, _SLOT.size * (self.workers + i))[0]
            for i, reason in enumerate(_REASONS)
        }


async def keep_beating(heartbeats: Heartbeats, index: int) -> None:
    while True:
        heartbeats.beat(index)
        await asyncio.sleep(BEAT_S)


class ReplacedCollector(Collector):
    def __init__(self, heartbeats: Heartbeats) -> None:
        self._heartbeats = heartbeats

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            WORKERS_REPLACED,
            "Workers of this instance the parent replaced: hung (no heartbeat for "
            "GATEWAY_WORKER_STUCK_S, killed) or crashed.",
            labels=["reason"],
        )
        for reason, count in self._heartbeats.replacements().items():
            family.add_metric([reason], count)
        yield family
