"""docs/benchmarks.md and its pictures, from the results of ``bench compare``.

Rendering is pure (results in, markdown out) so it can be tested without running anything;
the plots need matplotlib (the ``bench`` extra) and are skipped, with a note, without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.compare.checks import Check
from bench.compare.phases import PhaseFigures
from bench.compare.results import (
    FleetResult,
    Measurement,
    RouteFigures,
    WorkloadInfo,
    merge_routes,
)
from bench.compare.seeds import Figures, Spread, all_figures, seeds_text


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The header of the report."""

    command: str
    code: str
    """The git revision (and uncommitted paths) the run used."""
    date: str
    machine: str
    duration_s: float
    peers: str
    """Which peer versions ran, or why none did."""


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1000 * seconds:.0f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def measurement_row(m: Measurement) -> str:
    """One table row; columns as in TABLE_HEADER."""
    counts = m.requests_per_replica
    spread = f"{min(counts):.0f}-{max(counts):.0f}" if counts else "-"
    cells = [
        m.target.label,
        f"{m.ok}/{m.planned}",
        str(m.errors),
        _ms(m.ttft(50)),
        _ms(m.ttft(90)),
        _ms(m.ttft(99)),
        f"{1000 * m.itl(50):.1f}" if m.itls else "-",
        _ms(m.latency(50)),
        _ms(m.latency(90)),
        _ms(m.latency(99)),
        f"{m.output_tokens_per_s:.0f}",
        pct(m.hit_rate),
        ratio(m.hit_fraction_of_bound),
        spread,
        ratio(m.balance),
    ]
    return "| " + " | ".join(cells) + " |"


def _cell(value: Spread | None, show: Callable[[float], str]) -> str:
    return "-" if value is None else value.text(show)


def seeds_row(f: Figures) -> str:
    """One row for a target over several seeds: counts summed, each figure as the mean over
    seeds with its range; columns as in TABLE_HEADER."""
    runs = f.runs
    counts = [c for m in runs for c in m.requests_per_replica]
    spread = f"{min(counts):.0f}-{max(counts):.0f}" if counts else "-"
    cells = [
        f.target.label,
        f"{sum(m.ok for m in runs)}/{sum(m.planned for m in runs)}",
        str(sum(m.errors for m in runs)),
        _cell(f.ttft(50), _ms),
        _cell(f.ttft(90), _ms),
        _cell(f.ttft(99), _ms),
        _cell(f.over(lambda m: m.itl(50)), lambda v: f"{1000 * v:.1f}"),
        _cell(f.over(lambda m: m.latency(50)), _ms),
        _cell(f.over(lambda m: m.latency(90)), _ms),
        _cell(f.over(lambda m: m.latency(99)), _ms),
        _cell(f.over(lambda m: m.output_tokens_per_s), lambda v: f"{v:.0f}"),
        _cell(f.hit_rate, pct),
        _cell(f.hit_fraction, ratio),
        spread,
        _cell(f.balance, ratio),
    ]
    return "| " + " | ".join(cells) + " |"


def figures_row(f: Figures) -> str:
    return measurement_row(f.runs[0]) if len(f.runs) == 1 else seeds_row(f)


PHASE_HEADER = (
    "| target | phase | arrived | good | goodput (req/s) | TTFT p99 |\n"
    "|---|---|---:|---:|---:|---:|"
)


def shown_phases(m: Measurement) -> tuple[PhaseFigures, ...]:
    """The phases worth a row: a run of one phase has its whole-run ("all") figures twice."""
    if len(m.phases) == 2 and m.phases[-1].name == "all":
        return m.phases[:1]
    return m.phases


def phase_rows(measurements: Sequence[Measurement], several: bool = False) -> list[str]:
    """Goodput per arrival phase, for phased workloads (overload, the Mooncake replay); with
    ``several`` seeds, each seed's."""
    return [
        f"| {m.target.label}{f' (seed {m.seed})' if several else ''} | {p.name} | {p.arrived} "
        f"| {p.good} | {p.goodput:.2f} | {_ms(p.ttft_p99_s)} |"
        for m in measurements
        for p in shown_phases(m)
    ]


def trace_bound_line(workload: WorkloadInfo, table: Sequence[Figures]) -> str | None:
    """A replayed trace's own bound, and each target's hit rate as a fraction of it."""
    if workload.trace_bound is None:
        return None
    fractions = ", ".join(
        f"{f.target.label} {ratio(_fraction(f.hit_rate, workload.trace_bound))}" for f in table
    )
    return (
        f"- The trace's own bound (its block ids): {pct(workload.trace_bound)}; "
        f"hit / trace bound: {fractions}."
    )


def _fraction(rate: Spread | None, bound: float) -> float | None:
    return None if rate is None or bound <= 0 else rate.mean / bound


TABLE_HEADER = (
    "| target | ok/planned | errors | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | E2E p50 "
    "| E2E p90 | E2E p99 | out tok/s | hit rate | hit / bound | req per replica | max/mean |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def checks_table(checks: Sequence[Check]) -> list[str]:
    lines = ["| check | result | figures |", "|---|---|---|"]
    lines += [f"| {c.name} | **{c.status}** | {c.figures} |" for c in checks]
    return lines


def fleet_section(fleet: FleetResult, images: Sequence[str]) -> list[str]:
    lines = [f"## {fleet.title}", ""]
    if fleet.skipped is not None:
        return [*lines, f"Not run: {fleet.skipped}", ""]
    lines += fleet.description
    if fleet.skipped_targets:
        lines += [f"- Not run: {label} ({why})" for label, why in fleet.skipped_targets.items()]
    lines += [f"- Wall time of this fleet's comparison: {fleet.wall_s / 60:.1f} min", ""]
    for workload in fleet.workloads:
        measurements = fleet.for_workload(workload.key)
        bound = measurements[0].bound if measurements else None
        several = len(workload.seeds) > 1
        per_seed = " per seed" if several else ""
        lines += [
            f"### {workload.title}",
            "",
            f"- Definition: {workload.definition}",
            f"- Here: {workload.parameters}",
            f"- Arrivals: {workload.arrival}; {workload.requests} requests per target{per_seed}.",
        ]
        if several:
            lines.append(
                f"- Seeds {seeds_text(workload.seeds)} (text and arrivals): each figure is the "
                "mean over seeds with its range (min-max) in brackets; ok/planned and errors "
                "are summed; the acceptance checks read the means."
            )
        if bound is not None and not several:
            lines.append(
                f"- Affinity bound: {pct(bound.bound)} ({bound.reusable_tokens:,} of "
                f"{bound.prompt_tokens:,} prompt tokens were seen in an earlier prompt)."
            )
        elif several:
            bounds = ", ".join(
                f"seed {m.seed} {pct(m.bound.bound)}"
                for m in measurements
                if m.target == measurements[0].target
            )
            lines.append(f"- Affinity bound: {bounds}.")
        table = all_figures(fleet, workload.key)
        trace_line = trace_bound_line(workload, table)
        if trace_line is not None:
            lines.append(trace_line)
        lines += ["", TABLE_HEADER]
        lines += [figures_row(f) for f in table]
        if any(m.phases for m in measurements):
            lines += ["", PHASE_HEADER, *phase_rows(measurements, several)]
        notes = [
            f"- {f.target.label} routes (x-gateway-route{', all seeds' if several else ''}; "
            "per route: requests, the share of their prompt tokens served from cache, TTFT "
            "p50 / p99): " + "; ".join(route_text(r) for r in _routes(f.runs))
            for f in table
            if _routes(f.runs)
        ]
        notes += [
            f"- {m.target.label}{f' (seed {m.seed})' if several else ''}, first error: "
            f"`{_one_line(m.first_error)}`"
            for m in measurements
            if m.first_error
        ]
        lines += ["", *notes, ""] if notes else [""]
    lines += [f"![{alt}]({name})" for alt, name in _image_alts(images)]
    lines.append("")
    return lines


def _routes(runs: Sequence[Measurement]) -> tuple[RouteFigures, ...]:
    return merge_routes(r for m in runs for r in m.routes)


def route_text(r: RouteFigures) -> str:
    """``prefix-hit 216 (hit 86%, 82 / 295 ms)``."""
    return (
        f"{r.route} {r.requests} (hit {pct(r.hit_rate)}, "
        f"{_ms_or_dash(r.ttft(50))} / {_ms_or_dash(r.ttft(99))} ms)"
    )


def _ms_or_dash(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1000 * seconds:.0f}"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())[:200].replace("`", "'")


def _image_alts(images: Sequence[str]) -> list[tuple[str, str]]:
    return [(Path(name).stem.replace("-", " "), name) for name in images]


def render_markdown(
    info: RunInfo,
    fleets: Sequence[FleetResult],
    checks: Sequence[Check],
    method: Sequence[str],
    notes: Sequence[str],
    images: dict[str, list[str]],
) -> str:
    """The whole docs/benchmarks.md. ``method`` and ``notes`` are markdown lines; ``images``
    maps a fleet key to its PNG file names (relative to the markdown file)."""
    lines = [
        "# Benchmarks: the gateway against vllm-router and sglang-router",
        "",
        "Generated by the command below from the committed code; do not edit by hand.",
        "",
        f"- Command: `{info.command}`",
        f"- Code: {info.code}",
        f"- Date: {info.date}",
        f"- Machine: {info.machine}",
        f"- Duration: {info.duration_s / 60:.1f} min",
        f"- Peers: {info.peers}",
        "",
        "## How it is measured",
        "",
        *method,
        "",
        "## Acceptance checks",
        "",
        *checks_table(checks),
        "",
    ]
    if notes:
        lines += ["### Reading the checks", "", *notes, ""]
    lines += [
        "Units: milliseconds unless marked; `hit / bound` is the fleet hit rate over the "
        "workload's affinity bound; `req per replica` is the fewest-most requests a "
        "replica finished; `max/mean` the busiest replica over the mean.",
        "",
    ]
    for fleet in fleets:
        lines += fleet_section(fleet, images.get(fleet.key, []))
    return "\n".join(lines).rstrip() + "\n"
