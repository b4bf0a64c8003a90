"""What ``bench compare`` measures, and the acceptance checks on it: pure data and arithmetic.

Everything here is computed the same way for every target: latencies from the client's own
clock (``bench.driver``), hit rates and requests per replica from the replicas' own counters
(``bench.replica_counters``), and the affinity bound from the prompts actually sent
(``bench.affinity``). Nothing is taken from a router's own account of what it did.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bench.affinity import AffinityBound
from bench.driver import RunResult, percentile
from bench.replica_counters import ReplicaCounters, fleet_cache, max_over_mean

TargetKind = Literal["gateway", "vllm-router", "sglang-router"]


@dataclass(frozen=True, slots=True)
class Target:
    """One router configuration under test."""

    kind: TargetKind
    policy: str

    @property
    def label(self) -> str:
        name = "gateway" if self.kind == "gateway" else self.kind
        return f"{name} {self.policy}"

    @property
    def is_peer(self) -> bool:
        return self.kind != "gateway"


PREFIX_AWARE = Target("gateway", "prefix-aware")
LEAST_LOADED = Target("gateway", "least-loaded")
ROUND_ROBIN = Target("gateway", "round-robin")
VLLM_RR = Target("vllm-router", "round_robin")
VLLM_CA = Target("vllm-router", "cache_aware")
SGLANG_CA = Target("sglang-router", "cache_aware")
GATEWAY_TARGETS = (PREFIX_AWARE, LEAST_LOADED, ROUND_ROBIN)
PEER_TARGETS = (VLLM_RR, VLLM_CA, SGLANG_CA)
CACHE_AWARE_PEERS = (VLLM_CA, SGLANG_CA)


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
    routes: tuple[tuple[str, int], ...] = ()
    """The gateway's x-gateway-route values and their counts, most common first (the peers
    send none): why it routed as it did, for reading its figures, not for comparing."""

    @property
    def ok(self) -> int:
        return self.sent - self.errors

    @property
    def not_sent(self) -> int:
        return self.planned - self.sent

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts, q)

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
        bound=bound,
        first_error=failed[0].error if failed else None,
        routes=tuple(Counter(r.route for r in run.results if r.route).most_common()),
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
    skipped_targets: dict[str, str] = field(default_factory=dict)
    """Target label -> why it did not run."""
    wall_s: float = 0.0

    def get(self, workload: str, target: Target) -> Measurement | None:
        return next(
            (m for m in self.measurements if m.workload == workload and m.target == target), None
        )

    def for_workload(self, workload: str) -> list[Measurement]:
        return [m for m in self.measurements if m.workload == workload]


Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    figures: str


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{1000 * seconds:.0f} ms"


def _status(ok: bool) -> Status:
    return "PASS" if ok else "FAIL"


def sim_checks(fleet: FleetResult, gsp: str, low: str, zipf: str) -> list[Check]:
    """The simulated fleet's acceptance checks (the issue's text), on workload keys given."""
    checks: list[Check] = []
    pa = fleet.get(gsp, PREFIX_AWARE)
    if pa is None or pa.hit_rate is None:
        checks.append(Check("generated-shared-prefix: hit rate >= 0.9 x bound", "SKIP", "no run"))
    else:
        fraction = pa.hit_fraction_of_bound or 0.0
        checks.append(
            Check(
                "generated-shared-prefix: prefix-aware hit rate >= 0.9 x the affinity bound",
                _status(fraction >= 0.9),
                f"hit rate {_pct(pa.hit_rate)}, bound {_pct(pa.bound.bound)}: "
                f"{fraction:.2f} x the bound",
            )
        )
    peers = [m for t in CACHE_AWARE_PEERS if (m := fleet.get(gsp, t)) is not None]
    peers = [m for m in peers if m.hit_rate is not None]
    if pa is None or pa.hit_rate is None or not peers:
        reasons = "; ".join(f"{k}: {v}" for k, v in fleet.skipped_targets.items()) or "no run"
        checks.append(
            Check("generated-shared-prefix: hit rate >= best cache_aware peer", "SKIP", reasons)
        )
        checks.append(Check("generated-shared-prefix: TTFT p90 <= that peer's", "SKIP", reasons))
    else:
        best = max(peers, key=lambda m: m.hit_rate or 0.0)
        checks.append(
            Check(
                "generated-shared-prefix: prefix-aware hit rate >= the better cache_aware peer's",
                _status((pa.hit_rate or 0.0) >= (best.hit_rate or 0.0)),
                f"prefix-aware {_pct(pa.hit_rate)} vs {best.target.label} {_pct(best.hit_rate)} ("
                + ", ".join(f"{m.target.label} {_pct(m.hit_rate)}" for m in peers)
                + ")",
            )
        )
        ours, theirs = pa.ttft(90), best.ttft(90)
        checks.append(
            Check(
                f"generated-shared-prefix: prefix-aware TTFT p90 <= {best.target.label}'s",
                _status(ours <= theirs),
                f"{_ms(ours)} vs {_ms(theirs)}",
            )
        )
    pa_low, ll_low = fleet.get(low, PREFIX_AWARE), fleet.get(low, LEAST_LOADED)
    if pa_low is None or ll_low is None:
        checks.append(Check("low-sharing: TTFT p50 within 10% of least-loaded", "SKIP", "no run"))
    else:
        ours, theirs = pa_low.ttft(50), ll_low.ttft(50)
        checks.append(
            Check(
                "low-sharing: prefix-aware TTFT p50 within 10% of least-loaded's",
                _status(ours <= 1.1 * theirs),
                f"{_ms(ours)} vs {_ms(theirs)} ({ours / theirs:.2f}x)",
            )
        )
    pa_zipf = fleet.get(zipf, PREFIX_AWARE)
    if pa_zipf is None or pa_zipf.balance is None:
        checks.append(Check("zipf: max/mean requests per replica <= 1.3", "SKIP", "no run"))
    else:
        counts = ", ".join(f"{c:.0f}" for c in pa_zipf.requests_per_replica)
        checks.append(
            Check(
                "zipf: prefix-aware max/mean requests per replica <= 1.3",
                _status(pa_zipf.balance <= 1.3),
                f"{pa_zipf.balance:.2f} (requests per replica: {counts})",
            )
        )
    return checks


def real_checks(fleet: FleetResult, workload: str) -> list[Check]:
    """The real-vLLM fleet's check: prefix-aware's fleet hit rate above round-robin's."""
    name = "real vLLM: prefix-aware fleet hit rate > round-robin's"
    if fleet.skipped is not None:
        return [Check(name, "SKIP", fleet.skipped)]
    pa, rr = fleet.get(workload, PREFIX_AWARE), fleet.get(workload, ROUND_ROBIN)
    if pa is None or rr is None or pa.hit_rate is None or rr.hit_rate is None:
        return [Check(name, "SKIP", "no run")]
    return [
        Check(
            name,
            _status(pa.hit_rate > rr.hit_rate),
            f"{_pct(pa.hit_rate)} vs {_pct(rr.hit_rate)}; {ttft_ratio_text(pa, rr)}",
        )
    ]


def ttft_ratio_text(pa: Measurement, rr: Measurement) -> str:
    """Prefix-aware's TTFT over round-robin's: mean, p50 and p90."""
    parts = []
    if pa.ttfts and rr.ttfts:
        ours, theirs = sum(pa.ttfts) / len(pa.ttfts), sum(rr.ttfts) / len(rr.ttfts)
        parts.append(f"TTFT mean {_ms(ours)} vs {_ms(theirs)} = {ours / theirs:.2f}x")
    for q in (50, 90):
        ours, theirs = pa.ttft(q), rr.ttft(q)
        ratio = ours / theirs if theirs and not math.isnan(theirs) else math.nan
        parts.append(f"TTFT p{q} {_ms(ours)} vs {_ms(theirs)} = {ratio:.2f}x")
    return "; ".join(parts)
