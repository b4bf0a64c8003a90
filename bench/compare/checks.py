"""The acceptance checks of ``bench compare`` (issue 13's), read from the measurements.

Generated-shared-prefix, Zipf and the real fleet's workload ran on several seeds: their checks
compare the means over seeds, or, over enough seeds, call a difference within the run-to-run
spread a tie. A check whose other side did not run (peers not installed, left out) says so and
is SKIP, not PASS; it is FAIL all the same when prefix-aware already loses to a target that ran,
or lost requests (its latencies and hit rate cover only those answered).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from bench.compare.plan import GSP, LOW, MRQA, OVERLOAD, REAL_GSP, ZIPF
from bench.compare.results import (
    CACHE_AWARE_PEERS,
    GATEWAY_TARGETS,
    LEAST_LOADED,
    PEER_TARGETS,
    PREFIX_AWARE,
    ROUND_ROBIN,
    SGLANG_CA,
    FleetResult,
    Measurement,
    Target,
)
from bench.compare.seeds import Figures, Spread, figures, mean, paired, seeds_text

Status = Literal["PASS", "FAIL", "SKIP", "TIE"]
"""TIE: the project's rule, a difference within the run-to-run spread is reported as a tie."""

TIE_MIN_SEEDS = 5
"""A tie is judged over at least this many paired seeds (the project's rule for a spread):
below, the standard error of so few differences is itself too uncertain to call one."""
ERROR_CHARS = 120
"""How much of a lost request's error a check's text quotes."""

GSP_BOUND_FRACTION = 0.95
REAL_BOUND_FRACTION = 0.9
"""The real fleet's bound is an estimate (another tokenizer, 32-token blocks): a looser bar."""
ZIPF_MAX_OVER_MEAN = 1.25
LOW_TTFT_SLACK = 1.05
ALL_PHASES = "all"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    figures: str


def pct(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def two(value: float) -> str:
    """A ratio (hit / bound, max/mean) to two places."""
    return f"{value:.2f}"


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{1000 * seconds:.0f} ms"


def _status(ok: bool) -> Status:
    return "PASS" if ok else "FAIL"


def _not_run(fleet: FleetResult, target: Target) -> str:
    why = fleet.skipped_targets.get(target.label)
    return f"{target.label} not run ({why})" if why else f"{target.label} not run"


def compare(
    name: str,
    fleet: FleetResult,
    ours: Figures | None,
    others: Sequence[Target],
    figure: Callable[[Figures], Spread | None],
    show: Callable[[float], str],
    *,
    higher_is_better: bool,
) -> Check:
    """Prefix-aware's figure against each of ``others``': at least as good as every one of
    them. Over ``TIE_MIN_SEEDS`` paired seeds, a difference within twice its standard error
    is a tie either way (TIE unless another target wins beyond it); over fewer, the means over
    seeds decide. FAIL whenever prefix-aware lost requests: its figures cover the rest only."""
    if ours is None:
        return Check(name, "SKIP", f"{PREFIX_AWARE.label}: no run")
    lost = _lost(ours)
    value = figure(ours)
    if value is None:
        return Check(name, "FAIL" if lost else "SKIP", lost or f"{PREFIX_AWARE.label}: no run")
    parts = [f"{PREFIX_AWARE.label} {value.text(show)}"]
    beaten, tied, missing, losses = False, False, [], []
    for target in others:
        theirs = figures(fleet, ours.runs[0].workload, target)
        spread_ = figure(theirs) if theirs is not None else None
        if theirs is None or spread_ is None:
            missing.append(_not_run(fleet, target))
            continue
        part = f"{target.label} {spread_.text(show)}"
        pair = paired(ours, theirs, figure)
        if pair is not None and pair.count < TIE_MIN_SEEDS:
            pair = None
        if pair is not None and pair.tie:
            tied = True
            part += (
                f" (tie: paired difference {_signed(pair.mean, show)} within 2 SE "
                f"{show(pair.twice_se)}, {pair.count} seeds)"
            )
        else:
            difference = value.mean - spread_.mean if pair is None else pair.mean
            beaten |= difference < 0 if higher_is_better else difference > 0
        if theirs.lost:
            losses.append(f"{target.label} lost {theirs.lost} of {theirs.planned} requests")
        parts.append(part)
    text = " vs ".join(parts[:2]) + "".join(f", {p}" for p in parts[2:])
    if len(ours.runs) > 1:
        text += f" (means over seeds {seeds_text(ours.seeds)}, range in brackets)"
    if losses:
        text += "; " + "; ".join(losses) + " (their figures cover the rest)"
    if missing:
        text += "; " + "; ".join(missing)
    if lost:
        return Check(name, "FAIL", f"{lost}; {text}")
    status: Status = (
        "FAIL" if beaten else "SKIP" if missing or len(parts) == 1 else "TIE" if tied else "PASS"
    )
    return Check(name, status, text)


def _signed(value: float, show: Callable[[float], str]) -> str:
    return show(value) if value < 0 else f"+{show(value)}"


def _lost(f: Figures) -> str | None:
    """What prefix-aware lost, or None when every planned request was answered."""
    if not f.lost:
        return None
    error = f.first_error
    if error is not None and len(error) > ERROR_CHARS:
        error = error[: ERROR_CHARS - 3] + "..."
    return f"{f.target.label} lost {f.lost} of {f.planned} planned requests" + (
        f" (first error: {error})" if error else ""
    )


def _spread_text(value: Spread | None, show: Callable[[float], str]) -> str:
    return "n/a" if value is None else value.text(show)


def _hit(f: Figures) -> Spread | None:
    return f.hit_rate


def _p90(f: Figures) -> Spread | None:
    return f.ttft(90)


def bound_check(pa: Figures | None, workload: str, least: float) -> Check:
    """Prefix-aware's hit rate (mean over seeds) is at least ``least`` x the affinity bound."""
    name = f"{workload}: prefix-aware hit rate >= {least:g} x the affinity bound"
    if pa is None:
        return Check(name, "SKIP", "no run")
    # The hit rate of the requests answered: those lost may have been the cold ones.
    lost = _lost(pa)
    if pa.hit_fraction is None:
        return Check(name, "FAIL" if lost else "SKIP", lost or "no run")
    fraction = pa.hit_fraction
    return Check(
        name,
        "FAIL" if lost else _status(fraction.mean >= least),
        (f"{lost}; " if lost else "")
        + f"hit rate {_spread_text(pa.hit_rate, pct)}, bound {_spread_text(pa.bound, pct)}: "
        f"{fraction.text(two)} x the bound"
        + (f" (seeds {seeds_text(pa.seeds)})" if len(pa.runs) > 1 else ""),
    )


def gsp_checks(fleet: FleetResult) -> list[Check]:
    pa = figures(fleet, GSP, PREFIX_AWARE)
    return [
        bound_check(pa, "generated-shared-prefix", GSP_BOUND_FRACTION),
        compare(
            "generated-shared-prefix: prefix-aware hit rate >= sglang-router cache_aware's",
            fleet,
            pa,
            [SGLANG_CA],
            _hit,
            pct,
            higher_is_better=True,
        ),
        compare(
            "generated-shared-prefix: prefix-aware TTFT p90 <= sglang-router cache_aware's",
            fleet,
            pa,
            [SGLANG_CA],
            _p90,
            ms,
            higher_is_better=False,
        ),
    ]


def _per_replica(runs: Sequence[Measurement]) -> str:
    return "; ".join(
        f"seed {m.seed}: " + ", ".join(f"{c:.0f}" for c in m.requests_per_replica) for m in runs
    )


def zipf_checks(fleet: FleetResult) -> list[Check]:
    pa = figures(fleet, ZIPF, PREFIX_AWARE)
    name = f"zipf: prefix-aware max/mean requests per replica <= {ZIPF_MAX_OVER_MEAN:g}"
    if pa is None or pa.balance is None:
        balance = Check(name, "SKIP", "no run")
    else:
        balance = Check(
            name,
            _status(pa.balance.mean <= ZIPF_MAX_OVER_MEAN),
            f"{pa.balance.text(two)} (requests per replica, {_per_replica(pa.runs)})",
        )
    return [
        balance,
        compare(
            "zipf: prefix-aware TTFT p90 <= sglang-router cache_aware's",
            fleet,
            pa,
            [SGLANG_CA],
            _p90,
            ms,
            higher_is_better=False,
        ),
    ]


def mrqa_checks(fleet: FleetResult) -> list[Check]:
    pa = figures(fleet, MRQA, PREFIX_AWARE)
    others = [t for t in [*fleet.targets, *_skipped(fleet)] if t != PREFIX_AWARE]
    return [
        compare(
            "multi-round QA: prefix-aware has the best hit rate of all targets",
            fleet,
            pa,
            others,
            _hit,
            pct,
            higher_is_better=True,
        ),
        compare(
            "multi-round QA: prefix-aware has the best TTFT p90 of all targets",
            fleet,
            pa,
            others,
            _p90,
            ms,
            higher_is_better=False,
        ),
    ]


def _skipped(fleet: FleetResult) -> list[Target]:
    """Targets the fleet was meant to run but did not (their labels are in skipped_targets)."""
    every = (*GATEWAY_TARGETS, *PEER_TARGETS)
    return [t for t in every if t.label in fleet.skipped_targets and t not in fleet.targets]


def low_check(fleet: FleetResult) -> Check:
    name = (
        f"low-sharing: prefix-aware TTFT p50 <= {LOW_TTFT_SLACK:g} x the better of "
        "least-loaded's and round-robin's"
    )
    pa = figures(fleet, LOW, PREFIX_AWARE)
    loads = [f for t in (LEAST_LOADED, ROUND_ROBIN) if (f := figures(fleet, LOW, t)) is not None]
    if pa is None or not loads:
        return Check(name, "SKIP", "no run")
    better = min(loads, key=lambda f: mean(f.ttft(50)))
    ours, theirs = mean(pa.ttft(50)), mean(better.ttft(50))
    others = ", ".join(f"{f.target.label} {ms(mean(f.ttft(50)))}" for f in loads)
    return Check(
        name,
        _status(ours <= LOW_TTFT_SLACK * theirs),
        f"{ms(ours)} vs {better.target.label}'s {ms(theirs)} ({ours / theirs:.2f}x; {others})",
    )


def sim_checks(fleet: FleetResult) -> list[Check]:
    """The default simulated fleet's checks: generated-shared-prefix, Zipf, multi-round QA,
    low sharing."""
    if fleet.skipped is not None:
        return [Check("simulated fleet", "SKIP", fleet.skipped)]
    return [*gsp_checks(fleet), *zipf_checks(fleet), *mrqa_checks(fleet), low_check(fleet)]


def _goodput(f: Figures) -> Spread | None:
    return f.over(lambda m: p.goodput if (p := m.phase(ALL_PHASES)) is not None else None)


def overload_checks(fleet: FleetResult) -> list[Check]:
    name = "overload: prefix-aware goodput >= every peer's"
    if fleet.skipped is not None:
        return [Check(name, "SKIP", fleet.skipped)]
    pa = figures(fleet, OVERLOAD, PREFIX_AWARE)
    return [
        compare(
            name,
            fleet,
            pa,
            PEER_TARGETS,
            _goodput,
            lambda v: f"{v:.2f}/s",
            higher_is_better=True,
        )
    ]


def mooncake_checks(fleet: FleetResult, report_keys: Collection[str]) -> list[Check]:
    """Each report-set window of the trace replay on its own (``report_keys``: their workload
    keys; tuning-set windows are reported, never checked): prefix-aware keeps at least the best
    cache-aware peer's share of the bound, with a TTFT p90 and p99 no worse than any peer's.
    No target is told an objective."""
    if fleet.skipped is not None:
        return [Check("Mooncake replay", "SKIP", fleet.skipped)]
    checks = []
    for workload in fleet.workloads:
        if workload.key not in report_keys:
            continue
        pa = figures(fleet, workload.key, PREFIX_AWARE)
        name = workload.title
        checks += [
            compare(
                f"{name}: prefix-aware hit / bound >= every cache_aware peer's",
                fleet, pa, CACHE_AWARE_PEERS, lambda f: f.hit_fraction, two,
                higher_is_better=True,
            ),
            compare(
                f"{name}: prefix-aware TTFT p90 <= every peer's",
                fleet, pa, PEER_TARGETS, _p90, ms, higher_is_better=False,
            ),
            compare(
                f"{name}: prefix-aware TTFT p99 <= every peer's",
                fleet, pa, PEER_TARGETS, lambda f: f.ttft(99), ms, higher_is_better=False,
            ),
        ]  # fmt: skip
    return checks


def real_checks(fleet: FleetResult) -> list[Check]:
    """The real-vLLM fleet's checks: prefix-aware against both cache-aware peers."""
    names = (
        "real vLLM: prefix-aware fleet hit rate >= both cache_aware peers'",
        "real vLLM: prefix-aware mean TTFT <= both cache_aware peers'",
        f"real vLLM: prefix-aware hit rate >= {REAL_BOUND_FRACTION:g} x the affinity bound",
    )
    if fleet.skipped is not None:
        return [Check(name, "SKIP", fleet.skipped) for name in names]
    pa = figures(fleet, REAL_GSP, PREFIX_AWARE)
    return [
        bound_check(pa, "real vLLM", REAL_BOUND_FRACTION),
        compare(names[0], fleet, pa, CACHE_AWARE_PEERS, _hit, pct, higher_is_better=True),
        compare(
            names[1],
            fleet,
            pa,
            CACHE_AWARE_PEERS,
            lambda f: f.mean_ttft,
            ms,
            higher_is_better=False,
        ),
    ]


def ttft_ratio_text(pa: Figures, rr: Figures) -> str:
    """Prefix-aware's TTFT over another target's, the means over seeds: mean, p50 and p90."""
    parts = []
    for name, ours, theirs in (
        ("mean", mean(pa.mean_ttft), mean(rr.mean_ttft)),
        ("p50", mean(pa.ttft(50)), mean(rr.ttft(50))),
        ("p90", mean(pa.ttft(90)), mean(rr.ttft(90))),
    ):
        ratio = ours / theirs if theirs and not math.isnan(theirs) else math.nan
        parts.append(f"TTFT {name} {ms(ours)} vs {ms(theirs)} = {ratio:.2f}x")
    return "; ".join(parts)
