"""The acceptance checks of ``bench compare``, read from the measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from bench.compare.results import (
    CACHE_AWARE_PEERS,
    LEAST_LOADED,
    PREFIX_AWARE,
    ROUND_ROBIN,
    FleetResult,
    Measurement,
)

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
