"""The report's method section, and notes that explain the checks from the figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean

from bench.compare.checks import TIE_MIN_SEEDS, Check, ms, pct, ttft_ratio_text, two
from bench.compare.comparison import CompareResult
from bench.compare.plan import DEFAULT_SEEDS, GSP, LOW, MRQA, OVERLOAD, REAL_GSP, TUNING_SEEDS, ZIPF
from bench.compare.results import (
    LEAST_LOADED,
    PREFIX_AWARE,
    ROUND_ROBIN,
    SGLANG_CA,
    FleetResult,
    merge_routes,
)
from bench.compare.seeds import Figures, Spread, all_figures, figures, mean
from bench.fleet_stats import EXTERNAL_HITS, HITS, QUERIES
from bench.replica_counters import REQUESTS

METHOD = [
    "- Targets run one after another on the same replica processes. Each target's router is "
    "started fresh for each workload (no routing state carries over) and stopped after it. "
    "The gateway runs `llm-gateway serve` with a one-pool policy file where only `policy` is "
    "set, and `prefix.events.endpoints`, where each replica publishes its KV-cache events "
    "(every replica here does: vLLM with `--kv-events-config`, the simulated ones in vLLM's "
    "wire format), read by every gateway target but one told `prefix.source: estimate` "
    "(`--estimate`). No target is told a TTFT objective, since the peers take none; the "
    "overload and Mooncake fleets also run a gateway target told theirs "
    "(`cost.ttft_objective_s`, named in its label), reported beside the others and read by "
    "no check. Every other value is the default. The peers run with the flags of TOOLS.md "
    "and their own defaults (bench/peers/); neither reads KV events.",
    "- Before each target: wait until no replica runs or queues a request and two scrapes "
    "0.3 s apart agree, POST /reset_prefix_cache?reset_external=true to every replica (again "
    "while one refuses, as vLLM does while a request holds blocks), then check again that the "
    "counters stand still. No target inherits a warm cache.",
    "- Load: streaming chat completions with usage, open loop: requests (or, in multi-round "
    "QA, users) arrive on a seeded Poisson schedule, the same for every target, whatever the "
    "earlier requests are doing. A multi-round user sends its rounds back to back, each with "
    "the real answers to the earlier ones in its history. Long-context agents run closed "
    "loop (a fixed number of requests in flight), as the workload's author ran them.",
    "- Seeds: generated-shared-prefix, Zipf, overload and the real fleet's shared prefix run "
    "once per seed (text and arrivals drawn anew); their rows and checks use the mean over "
    f"seeds, with the range in brackets. Over at least {TIE_MIN_SEEDS} seeds, a check against "
    "another target reads the per-seed differences instead: a mean difference within twice its "
    "standard error is a TIE. A check against another target or the affinity bound fails "
    "when prefix-aware lost any request (its latencies and hit rate cover only those "
    "answered). The other workloads run on the first seed. The targets take turns going "
    "first: the k-th workload a fleet runs (a seed, a trace window) measures them in the "
    "listed order rotated by k, so no target always runs first on a fleet. Routing "
    "parameters were chosen on the tuning seeds "
    f"{','.join(map(str, TUNING_SEEDS))} and the Mooncake tuning windows; the default seeds "
    f"{','.join(map(str, DEFAULT_SEEDS))} and the report windows were never tuned on.",
    "- Client-side figures (bench/driver.py): TTFT = time to the first content token; ITL = "
    "(end-to-end - TTFT) / (output tokens - 1) per request; E2E = until the end of the "
    "stream; output tokens/s = tokens received / the run's wall time.",
    "- Replica-side figures, the same for every target (peers send no x-gateway-* headers): "
    f"fleet hit rate = sum of `{HITS}` (plus `{EXTERNAL_HITS}`, a CPU tier's loads) deltas / "
    f"sum of `{QUERIES}` deltas; requests per "
    f"replica = each replica's `{REQUESTS}` delta.",
    "- Affinity bound = 1 - (prompt tokens in KV blocks no earlier prompt had) / (all prompt "
    "tokens), over the prompts actually sent: the hit rate of one replica with an unbounded "
    "cache, which no routing can beat. `hit / bound` reads each hit rate as a fraction of "
    "the possible (bench/affinity.py).",
    "- Client, routers and replicas share this machine's cores: a router's own CPU cost shows "
    "up in everyone's latency, as on a busy node.",
]


def _share(count: float, total: float) -> str:
    return f"{count:.0f} of {total:.0f} ({100 * count / total:.0f}%)" if total else "-"


def _routes(f: Figures) -> str:
    """The gateway's routes over every seed, with their shares."""
    sent = sum(m.sent for m in f.runs)
    routes = merge_routes(r for m in f.runs for r in m.routes)
    return ", ".join(f"`{r.route}` {_share(r.requests, sent)}" for r in routes)


def _text(value: Spread | None, show: Callable[[float], str]) -> str:
    return "n/a" if value is None else value.text(show)


def _failed(checks: Sequence[Check]) -> set[str]:
    """The workloads (the part of a check's name before its colon) with a FAIL."""
    return {c.name.split(":")[0] for c in checks if c.status == "FAIL"}


def _gsp_note(fleet: FleetResult) -> str | None:
    pa, sg = figures(fleet, GSP, PREFIX_AWARE), figures(fleet, GSP, SGLANG_CA)
    if pa is None:
        return None
    line = (
        f"- Generated shared prefix: prefix-aware's hit rate {_text(pa.hit_rate, pct)} is "
        f"{_text(pa.hit_fraction, two)} x the affinity bound; its routes: {_routes(pa)}. A "
        "request not sent to a replica that holds its group's system prompt prefills it cold "
        "and copies it onto a second replica, whose cache then evicts sooner."
    )
    if sg is not None:
        line += (
            f" {SGLANG_CA.label}: hit rate {_text(sg.hit_rate, pct)}, TTFT p90 "
            f"{_text(sg.ttft(90), ms)}, max/mean requests per replica "
            f"{_text(sg.balance, two)}, against prefix-aware's TTFT p90 "
            f"{_text(pa.ttft(90), ms)} and max/mean {_text(pa.balance, two)}."
        )
    return line


def _zipf_note(fleet: FleetResult) -> str | None:
    pa, sg = figures(fleet, ZIPF, PREFIX_AWARE), figures(fleet, ZIPF, SGLANG_CA)
    if pa is None:
        return None
    line = (
        f"- Zipf: prefix-aware's max/mean requests per replica {_text(pa.balance, two)}, "
        f"TTFT p90 {_text(pa.ttft(90), ms)}, hit rate {_text(pa.hit_rate, pct)}; its routes: "
        f"{_routes(pa)}. The hot group takes the largest share of the requests (see the "
        "workload's parameters): every replica it lives on takes a part of that share, every "
        "other one only the colder groups."
    )
    if sg is not None:
        line += (
            f" {SGLANG_CA.label}: max/mean {_text(sg.balance, two)}, TTFT p90 "
            f"{_text(sg.ttft(90), ms)}, hit rate {_text(sg.hit_rate, pct)}."
        )
    return line


def _best_notes(fleet: FleetResult, key: str, title: str) -> str | None:
    """Which targets beat prefix-aware, on what."""
    table = all_figures(fleet, key)
    pa = next((f for f in table if f.target == PREFIX_AWARE), None)
    if pa is None:
        return None
    ahead = [
        f"{f.target.label} (hit rate {_text(f.hit_rate, pct)}, TTFT p90 {_text(f.ttft(90), ms)})"
        for f in table
        if f is not pa
        and (mean(f.hit_rate) > mean(pa.hit_rate) or mean(f.ttft(90)) < mean(pa.ttft(90)))
    ]
    if not ahead:
        return None
    return (
        f"- {title}: prefix-aware's hit rate {_text(pa.hit_rate, pct)}, TTFT p90 "
        f"{_text(pa.ttft(90), ms)} (routes: {_routes(pa)}); ahead of it on one or both: "
        + "; ".join(ahead)
        + "."
    )


def _low_note(fleet: FleetResult) -> str | None:
    pa = figures(fleet, LOW, PREFIX_AWARE)
    if pa is None:
        return None
    loads = [f for t in (LEAST_LOADED, ROUND_ROBIN) if (f := figures(fleet, LOW, t)) is not None]
    return (
        "- Low sharing: the shared part is ~6% of a prompt, so no match is worth pinning for "
        f"and every prompt is a ~110 ms cold prefill; prefix-aware's TTFT p50 "
        f"{_text(pa.ttft(50), ms)} against "
        + ", ".join(f"{f.target.label}'s {_text(f.ttft(50), ms)}" for f in loads)
        + f"; its routes: {_routes(pa)}."
    )


def _overload_note(fleet: FleetResult) -> str | None:
    table = all_figures(fleet, OVERLOAD)
    if not table:
        return None
    parts = []
    for f in table:
        # Each phase's goodput, the mean over the seeds where there are several.
        names = [p.name for p in f.runs[0].phases]
        phases = ", ".join(
            f"{name} {fmean(p.goodput for m in f.runs for p in m.phases if p.name == name):.2f}/s"
            for name in names
        )
        parts.append(f"{f.target.label}: {phases}; max/mean {_text(f.balance, two)}")
    over = "" if len(table[0].runs) == 1 else f" (means over {len(table[0].runs)} seeds)"
    return f"- Overload, goodput per phase{over}: " + "; ".join(parts) + "."


def sim_notes(fleet: FleetResult, checks: Sequence[Check]) -> list[str]:
    """Why the default simulated fleet's checks failed, from the figures themselves."""
    failed = _failed(checks)
    notes_: list[str | None] = []
    if "generated-shared-prefix" in failed:
        notes_.append(_gsp_note(fleet))
    if "zipf" in failed:
        notes_.append(_zipf_note(fleet))
    if "multi-round QA" in failed:
        notes_.append(_best_notes(fleet, MRQA, "Multi-round QA"))
    if "low-sharing" in failed:
        notes_.append(_low_note(fleet))
    lines = [line for line in notes_ if line is not None]
    return lines + _lopsided(fleet)


def _lopsided(fleet: FleetResult) -> list[str]:
    """Any target that sent at least twice the mean to one replica, on any workload."""
    lines = []
    for workload in fleet.workloads:
        for m in fleet.for_workload(workload.key):
            if m.balance is not None and m.balance >= 2.0:
                top = max(m.requests_per_replica)
                seed = f" (seed {m.seed})" if len(workload.seeds) > 1 else ""
                lines.append(
                    f"- {workload.title}{seed}: {m.target.label} sent "
                    f"{_share(top, sum(m.requests_per_replica))} requests to one replica of "
                    f"{len(m.requests_per_replica)} (max/mean {m.balance:.2f})."
                )
    return lines


def overload_notes(fleet: FleetResult, checks: Sequence[Check]) -> list[str]:
    note = _overload_note(fleet) if "overload" in _failed(checks) else None
    return ([note] if note else []) + _lopsided(fleet)


def notes(result: CompareResult) -> list[str]:
    """What the checks mean, with the figures behind any that failed."""
    lines: list[str] = []
    for fleet in result.fleets:
        if fleet.skipped is not None:
            continue
        if fleet.key == "sim":
            lines += sim_notes(fleet, result.checks)
        elif fleet.key == "overload":
            lines += overload_notes(fleet, result.checks)
        elif fleet.key in ("agents", "mooncake"):
            lines += _lopsided(fleet)
        elif fleet.key == "real":
            pa, rr = figures(fleet, REAL_GSP, PREFIX_AWARE), figures(fleet, REAL_GSP, ROUND_ROBIN)
            if pa is not None and rr is not None:
                lines.append(
                    "- Real vLLM, prefix-aware vs round-robin (means over seeds): "
                    f"{ttft_ratio_text(pa, rr)}."
                )
    return lines
