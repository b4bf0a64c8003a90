"""What ``bench compare`` measures, and the acceptance checks on it: pure data and arithmetic.

Everything here is computed the same way for every target: latencies from the client's own
clock (``bench.driver``), hit rates and requests per replica from the replicas' own counters
(``bench.replica_counters``), and the affinity bound from the prompts actually sent
(``bench.affinity``). Nothing is taken from a router's own account of what it did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bench.affinity import AffinityBound
from bench.compare.phases import PhaseFigures
from bench.driver import RequestResult, RunResult, percentile
from bench.replica_counters import (
    ReplicaCounters,
    fleet_cache,
    max_over_mean,
)

TargetKind = Literal["gateway", "vllm-router", "sglang-router"]


@dataclass(frozen=True, slots=True)
class Target:
    """One router configuration under test."""

    kind: TargetKind
    policy: str
    objective_s: float | None = None
    """The TTFT objective the gateway's pool is told (``cost.ttft_objective_s``); None: none.
    The peers take no such setting, so a like-for-like comparison gives it to no target."""
    source: str | None = None
    """The gateway pool's ``prefix.source`` (None: the default, the events where published)."""

    @property
    def label(self) -> str:
        name = "gateway" if self.kind == "gateway" else self.kind
        told = f" (objective {self.objective_s:g} s)" if self.objective_s is not None else ""
        source = f" ({self.source})" if self.source is not None else ""
        return f"{name} {self.policy}{told}{source}"

    @property
    def is_peer(self) -> bool:
        return self.kind != "gateway"


PREFIX_AWARE = Target("gateway", "prefix-aware")
LEAST_LOADED = Target("gateway", "least-loaded")
ROUND_ROBIN = Target("gateway", "round-robin")
VLLM_RR = Target("vllm-router", "round_robin")
VLLM_CA = Target("vllm-router", "cache_aware")
SGLANG_CA = Target("sglang-router", "cache_aware")
ESTIMATE_TARGET = Target("gateway", "prefix-aware", source="estimate")
"""prefix-aware on its estimate only, the replicas' KV-cache events unread (bench compare
--estimate)."""
GATEWAY_TARGETS = (PREFIX_AWARE, LEAST_LOADED, ROUND_ROBIN)
PEER_TARGETS = (VLLM_RR, VLLM_CA, SGLANG_CA)
CACHE_AWARE_PEERS = (VLLM_CA, SGLANG_CA)


@dataclass(frozen=True, slots=True)
class RouteFigures:
    """The requests the gateway routed one way (an x-gateway-route value): how many, how much
    of their prompts the replicas served from cache (their own usage reports), their TTFTs;
    so that a regression shows which route it comes from."""

    route: str
    requests: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttfts: tuple[float, ...] = ()

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)


def route_figures(results: Iterable[RequestResult]) -> tuple[RouteFigures, ...]:
    """Per route of the requests that carried one, most requests first."""
    by_route: dict[str, list[RequestResult]] = {}
    for r in results:
        if r.route:
            by_route.setdefault(r.route, []).append(r)
    return merge_routes(
        RouteFigures(
            route,
            len(rs),
            sum(r.prompt_tokens for r in rs if r.ok),
            sum(r.cached_tokens for r in rs if r.ok),
            tuple(r.ttft_s for r in rs if r.ok and r.ttft_s is not None),
        )
        for route, rs in by_route.items()
    )


def merge_routes(figures: Iterable[RouteFigures]) -> tuple[RouteFigures, ...]:
    """The same routes' figures summed (runs on several seeds), most requests first."""
    merged: dict[str, RouteFigures] = {}
    for f in figures:
        m = merged.get(f.route)
        merged[f.route] = f if m is None else RouteFigures(
            f.route,
            m.requests + f.requests,
            m.prompt_tokens + f.prompt_tokens,
            m.cached_tokens + f.cached_tokens,
            m.ttfts + f.ttfts,
        )  # fmt: skip
    return tuple(sorted(merged.values(), key=lambda f: (-f.requests, f.route)))


@dataclass(frozen=True, slots=True)
class Measurement:
    """One target on one workload."""

    target: Target
    workload: str
    planned: int
    sent: int
    errors: int
    wall_s: float
    ttfts: tuple[float, ...]
    """Seconds, successful requests only, in completion order (for the CDF plots)."""
    latencies: tuple[float, ...]
    itls: tuple[float, ...]
    """Per request: (latency - TTFT) / (output tokens - 1), the mean gap between tokens."""
    output_tokens: int
    cache_queries: float
    cache_hits: float
    requests_per_replica: tuple[float, ...]
    """From each replica's vllm:request_success_total delta, in fleet order."""
    bound: AffinityBound
    first_error: str | None = None
    routes: tuple[RouteFigures, ...] = ()
    """Per x-gateway-route value, most common first (the peers send none): why the gateway
    routed as it did and what each route gave, for reading its figures, not for comparing."""
    seed: int = 0
    """The workload's seed (text and arrivals): a workload run on several seeds has one
    measurement per seed and target."""
    phases: tuple[PhaseFigures, ...] = ()
    """Goodput and TTFT per arrival phase, then the whole run's ("all"): phased workloads only."""
    prefilled_per_replica: tuple[float, ...] = ()
    """Prompt tokens each replica prefilled (its cache queries less its hits), in fleet order:
    the new text it stored, evicting as much of older histories."""

    @property
    def ok(self) -> int:
        return self.sent - self.errors

    @property
    def not_sent(self) -> int:
        return self.planned - self.sent

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)

    @property
    def mean_ttft(self) -> float:
        return sum(self.ttfts) / len(self.ttfts) if self.ttfts else math.nan

    def phase(self, name: str) -> PhaseFigures | None:
        return next((p for p in self.phases if p.name == name), None)

    def latency(self, q: float) -> float:
        return percentile(self.latencies, q)

    def itl(self, q: float) -> float:
        return percentile(self.itls, q)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def hit_rate(self) -> float | None:
        """Fleet prefix-cache hit rate: sum of hits over sum of queries, all replicas."""
        return self.cache_hits / self.cache_queries if self.cache_queries else None

    @property
    def hit_fraction_of_bound(self) -> float | None:
        rate = self.hit_rate
        if rate is None or self.bound.bound <= 0:
            return None
        return rate / self.bound.bound

    @property
    def balance(self) -> float | None:
        """Max over mean requests per replica (1.0 is even)."""
        return max_over_mean(self.requests_per_replica)


def summarize(
    target: Target,
    workload: str,
    run: RunResult,
    counters: Mapping[str, ReplicaCounters],
    replica_order: Sequence[str],
    bound: AffinityBound,
    *,
    seed: int = 0,
    phases: tuple[PhaseFigures, ...] = (),
) -> Measurement:
    """One run's figures: ``counters`` are the replicas' deltas over the run, by base URL."""
    ok = [r for r in run.results if r.ok]
    itls = [
        (r.latency_s - r.ttft_s) / (r.output_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.output_tokens > 1
    ]
    cache = fleet_cache(counters)
    failed = [r for r in run.results if not r.ok]
    return Measurement(
        target=target,
        workload=workload,
        planned=run.planned,
        sent=run.sent,
        errors=len(failed),
        wall_s=run.wall_s,
        ttfts=tuple(run.ttfts()),
        latencies=tuple(run.latencies()),
        itls=tuple(itls),
        output_tokens=sum(r.output_tokens for r in ok),
        cache_queries=cache.queries,
        cache_hits=cache.hits,
        requests_per_replica=tuple(
            counters[url].requests if url in counters else 0.0 for url in replica_order
        ),
        prefilled_per_replica=tuple(
            counters[url].cache.queries - counters[url].cache.hits if url in counters else 0.0
            for url in replica_order
        ),
        bound=bound,
        first_error=failed[0].error if failed else None,
        routes=route_figures(run.results),
        seed=seed,
        phases=phases,
    )


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """How a workload was built, for the report."""

    key: str
    title: str
    definition: str
    """Where its shape comes from (SGLang, vLLM production stack, llm-d, ...)."""
    parameters: str
    """The parameters used here and how they scale the definition."""
    requests: int
    arrival: str
    """The arrival process, e.g. Poisson at 16 req/s."""
    seeds: tuple[int, ...] = (0,)
    """The seeds it ran with; ``requests`` is per seed."""
    trace_bound: float | None = None
    """A replayed trace's own bound, from its block ids (Mooncake), besides the affinity
    bound over the prompts as sent; None for the generated workloads."""


@dataclass(slots=True)
class FleetResult:
    """One fleet's comparison: every target on every workload, or the reason it did not run."""

    key: str
    """"sim" or "real"."""
    title: str
    description: list[str] = field(default_factory=list)
    """Markdown bullet lines: replicas, KV, timing and where it comes from, bound method."""
    workloads: list[WorkloadInfo] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    skipped: str | None = None
    """Why the whole fleet did not run."""
    failed: bool = False
    """It started and raised (``skipped`` says what): the run is not a complete report."""
    skipped_targets: dict[str, str] = field(default_factory=dict)
    """Target label -> why it did not run."""
    wall_s: float = 0.0

    def get(self, workload: str, target: Target) -> Measurement | None:
        """The target's first run on the workload (its first seed)."""
        return next(
            (m for m in self.measurements if m.workload == workload and m.target == target), None
        )

    def runs(self, workload: str, target: Target) -> list[Measurement]:
        """The target's runs on the workload, one per seed."""
        return [m for m in self.measurements if m.workload == workload and m.target == target]

    def workload(self, key: str) -> WorkloadInfo | None:
        return next((w for w in self.workloads if w.key == key), None)

    def for_workload(self, workload: str) -> list[Measurement]:
        return [m for m in self.measurements if m.workload == workload]
