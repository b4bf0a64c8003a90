"""Prefix-cache hit rates from the replicas' own /metrics, not from the gateway's beliefs.

vLLM counts ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` in tokens.
A run's hit rate is the delta of both between two snapshots; the fleet's is the sum of hits over
the sum of queries across replicas (a mean of per-replica rates would weigh an idle replica as
much as a busy one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from replica.vllm_metrics import (
    EXTERNAL_PREFIX_CACHE_HITS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    total,
)

QUERIES = total(PREFIX_CACHE_QUERIES)
HITS = total(PREFIX_CACHE_HITS)
EXTERNAL_HITS = total(EXTERNAL_PREFIX_CACHE_HITS)
"""Tokens a CPU tier loaded back: vLLM counts them apart from the GPU cache's hits; here they
are hits of the query all the same (not computed again)."""
CACHE_SERIES = (QUERIES, HITS, EXTERNAL_HITS)
_TIMEOUT = aiohttp.ClientTimeout(total=5.0)
_JSON = "application/json"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """Prefix-cache counters of one replica, in tokens."""

    queries: float = 0.0
    hits: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        """Hits over queries; None when nothing was queried (no rate, rather than 0%)."""
        return self.hits / self.queries if self.queries else None

    def __sub__(self, earlier: CacheCounters) -> CacheCounters:
        if self.queries < earlier.queries or self.hits < earlier.hits:
            # The counters went backwards: the replica restarted; all it counted is new.
            return self
        return CacheCounters(self.queries - earlier.queries, self.hits - earlier.hits)


Snapshot = dict[str, CacheCounters]
"""Counters per replica base URL."""


def sum_samples(text: str, names: Collection[str]) -> dict[str, float]:
    """Each named sample of a Prometheus text exposition, summed over its label sets (model
    names, LoRA adapters, finish reasons); a missing series counts as zero."""
    sums = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


def cache_counters(sums: Mapping[str, float]) -> CacheCounters:
    """The prefix-cache counters out of ``sum_samples`` taken over (at least) CACHE_SERIES."""
    return CacheCounters(sums[QUERIES], sums[HITS] + sums[EXTERNAL_HITS])


def parse_cache_counters(text: str) -> CacheCounters:
    """The counters from a Prometheus text exposition, summed over label sets."""
    return cache_counters(sum_samples(text, CACHE_SERIES))


async def scrape_all(urls: Sequence[str], parse: Callable[[str], T]) -> dict[str, T]:
    """Every replica's /metrics, parsed, by base URL. Raises on a failed scrape: a missing
    replica must not silently count as a replica with no traffic."""
    async with aiohttp.ClientSession() as session:

        async def scrape(url: str) -> T:
            async with session.get(f"{url}/metrics", timeout=_TIMEOUT) as response:
                response.raise_for_status()
                return parse(await response.text())

        parsed = await asyncio.gather(*(scrape(url) for url in urls))
    return dict(zip(urls, parsed, strict=True))


async def snapshot(urls: Sequence[str]) -> Snapshot:
    return await scrape_all(urls, parse_cache_counters)


RESET = "/reset_prefix_cache?reset_external=true"
"""A CPU tier (vLLM's KV connector) is emptied only when asked: kept, it would count hits for
the next target that no routing of its earned."""
RESET_TRIES = 20
"""A refused reset is tried again this many times, 0.25 s apart: vLLM refuses while a request
still holds blocks (a straggler finishing, an offload transfer in flight)."""


async def reset_prefix_caches(urls: Sequence[str]) -> None:
    """Empty every replica's prefix cache (vLLM's POST /reset_prefix_cache); counters stay.
    Raises when one keeps refusing: its 200 says `{"success": false}`, and a run measured on
    a cache left warm would count hits no routing earned."""
    async with aiohttp.ClientSession() as session:

        async def reset(url: str) -> None:
            for _ in range(RESET_TRIES):
                async with session.post(f"{url}{RESET}", timeout=_TIMEOUT) as answer:
                    answer.raise_for_status()
                    said = await answer.json() if answer.content_type == _JSON else None
                # Older vLLMs answer with no body: taken at their word.
                if not isinstance(said, dict) or said.get("success") is not False:
                    return
                await asyncio.sleep(0.25)
            raise RuntimeError(f"{url} refused to reset its prefix cache {RESET_TRIES} times")

        await asyncio.gather(*(reset(url) for url in urls))


def delta(before: Mapping[str, CacheCounters], after: Mapping[str, CacheCounters]) -> Snapshot:
    """What each replica counted between two snapshots (a replica new in ``after`` counts all)."""
    return {url: counters - before.get(url, CacheCounters()) for url, counters in after.items()}


def fleet_counters(counters: Mapping[str, CacheCounters]) -> CacheCounters:
    return CacheCounters(
        sum(c.queries for c in counters.values()), sum(c.hits for c in counters.values())
    )


def fleet_hit_rate(counters: Mapping[str, CacheCounters]) -> float | None:
    """Sum of hits over sum of queries across replicas."""
    return fleet_counters(counters).hit_rate
