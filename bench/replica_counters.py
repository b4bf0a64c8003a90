"""What each replica did during a run, from its own /metrics: the one account every router gets.

Peer routers send no x-gateway-replica header, so requests per replica are counted where they
land: the delta of each replica's ``vllm:request_success_total`` (the sim and vLLM both export
it, by finish reason). The prefix-cache counters come from ``bench.fleet_stats``. Between two
targets the replicas' prefix caches are emptied and the counters checked to have stopped moving,
so that no target inherits a warm cache or a straggler of the previous one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.fleet_stats import (
    CACHE_SERIES,
    CacheCounters,
    cache_counters,
    fleet_counters,
    reset_prefix_caches,
    scrape_all,
    sum_samples,
)
from replica.vllm_metrics import NUM_RUNNING, NUM_WAITING, REQUEST_SUCCESS, total

REQUESTS = total(REQUEST_SUCCESS)
RUNNING = NUM_RUNNING
WAITING = NUM_WAITING
SETTLE_S = 0.3
"""Two scrapes this far apart must agree before a replica counts as quiet."""


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """One replica's counters (and, in a snapshot, its queue gauges)."""

    requests: float = 0.0
    """Requests finished normally (``vllm:request_success_total``, all finish reasons)."""
    cache: CacheCounters = field(default_factory=CacheCounters)
    running: float = 0.0
    waiting: float = 0.0

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def __sub__(self, earlier: ReplicaCounters) -> ReplicaCounters:
        """Counters as deltas; gauges as they are now. A replica that restarted counts all."""
        requests = self.requests - earlier.requests
        if requests < 0:
            requests = self.requests
        return ReplicaCounters(requests, self.cache - earlier.cache, self.running, self.waiting)

    def same_counts(self, other: ReplicaCounters) -> bool:
        return self.requests == other.requests and self.cache == other.cache


def parse_replica_counters(text: str) -> ReplicaCounters:
    """A replica's counters from its Prometheus text exposition (parsed once), summed over
    label sets."""
    sums = sum_samples(text, (REQUESTS, RUNNING, WAITING, *CACHE_SERIES))
    return ReplicaCounters(sums[REQUESTS], cache_counters(sums), sums[RUNNING], sums[WAITING])


async def snapshot(urls: Sequence[str]) -> dict[str, ReplicaCounters]:
    """Every replica's counters by base URL; raises if one cannot be scraped (a missing replica
    must not pass for an idle one)."""
    return await scrape_all(urls, parse_replica_counters)


def delta(
    before: Mapping[str, ReplicaCounters], after: Mapping[str, ReplicaCounters]
) -> dict[str, ReplicaCounters]:
    return {url: now - before.get(url, ReplicaCounters()) for url, now in after.items()}


def fleet_cache(counters: Mapping[str, ReplicaCounters]) -> CacheCounters:
    return fleet_counters({url: c.cache for url, c in counters.items()})


def max_over_mean(values: Sequence[float]) -> float | None:
    """Imbalance of per-replica counts: the busiest over the mean (1.0 is perfectly even);
    None when nothing was counted."""
    if not values or sum(values) == 0:
        return None
    return max(values) / (sum(values) / len(values))


class NotQuiet(RuntimeError):
    """The replicas kept working (or counting) past the deadline."""


async def wait_quiet(
    urls: Sequence[str], timeout_s: float = 60.0, settle_s: float = SETTLE_S
) -> dict[str, ReplicaCounters]:
    """Wait until no replica runs or queues a request and two scrapes ``settle_s`` apart show the
    same counts; returns the later snapshot."""
    deadline = time.monotonic() + timeout_s
    earlier = await snapshot(urls)
    while True:
        await asyncio.sleep(settle_s)
        now = await snapshot(urls)
        quiet = all(c.idle for c in now.values()) and all(
            now[url].same_counts(earlier[url]) for url in urls
        )
        if quiet:
            return now
        if time.monotonic() > deadline:
            busy = [url for url in urls if not now[url].idle]
            raise NotQuiet(f"replicas still busy after {timeout_s} s: {busy or 'counters moving'}")
        earlier = now


async def reset_and_verify(
    urls: Sequence[str], timeout_s: float = 60.0, settle_s: float = SETTLE_S
) -> dict[str, ReplicaCounters]:
    """Empty every replica's prefix cache once they are quiet, and check that the counters stop
    moving afterwards. Returns the snapshot to measure the next run from."""
    await wait_quiet(urls, timeout_s, settle_s)
    await reset_prefix_caches(urls)
    return await wait_quiet(urls, timeout_s, settle_s)
