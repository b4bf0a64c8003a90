"""The command line of ``llm-gateway bench compare``: run, print a summary, write the report."""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import uvloop

from bench.compare.code_state import CodeState, code_line
from bench.compare.comparison import CompareConfig, CompareResult, run_compare
from bench.compare.markdown import RunInfo, pct, ratio, render_markdown, shown_phases
from bench.compare.mooncake import (
    CACHE_DIR,
    REPORT_WINDOWS,
    SHIPPED_WINDOW,
    TUNING_WINDOWS,
    WINDOW_SETS,
    parse_window,
    trace_problem,
)
from bench.compare.notes import METHOD, notes
from bench.compare.plan import DEFAULT_SEEDS, MOONCAKE, SIM_FLEET_WORKLOADS, TUNING_SEEDS
from bench.compare.plots import plots_available, write_plots
from bench.compare.seeds import Spread, all_figures, mean, seeds_text
from bench.host import machine_description


def write_report(result: CompareResult, config: CompareConfig, out: TextIO) -> Path | None:
    if config.out is None:
        return None
    out_dir = config.out
    images: dict[str, list[str]] = {}
    missing = plots_available()
    if missing is not None:
        print(f"[compare] no plots: {missing}", file=out)
    else:
        for fleet in result.fleets:
            if fleet.skipped is None:
                images[fleet.key] = write_plots(fleet, out_dir)
    info = RunInfo(
        command=config.command(),
        code=code_line(result.code or CodeState.now(), CodeState.now()),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{machine_description()}; load average at the end "
        + ", ".join(f"{load:.2f}" for load in os.getloadavg())
        + " (1, 5, 15 min: anything else running on the machine shows here)",
        duration_s=result.duration_s,
        peers=result.peers,
    )
    text = render_markdown(info, result.fleets, result.checks, METHOD, notes(result), images)
    path = out_dir / "benchmarks.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text + _kept_sections(path), encoding="utf-8")
    return path


KEPT_MARKER = "<!-- sections below come from other benchmarks: bench compare keeps them -->"


def _kept_sections(path: Path) -> str:
    """What other benchmarks wrote below the marker (bench instances), kept as it was."""
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    at = old.find(KEPT_MARKER)
    return "" if at < 0 else "\n" + old[at:]


def print_summary(result: CompareResult, out: TextIO) -> None:
    """The tables and checks on the terminal, in short."""
    for fleet in result.fleets:
        print(f"\n{fleet.title}", file=out)
        if fleet.skipped is not None:
            print(f"  skipped: {fleet.skipped}", file=out)
            continue
        for workload in fleet.workloads:
            table = all_figures(fleet, workload.key)
            bound = mean(table[0].bound) if table else math.nan
            several = f", mean of seeds {seeds_text(workload.seeds)}" * (len(workload.seeds) > 1)
            print(f"  {workload.title} (affinity bound {100 * bound:.1f}%{several})", file=out)
            print(
                f"    {'target':28}{'ok':>9}{'TTFT p50':>10}{'p90':>8}{'p99':>8}{'ITL':>7}"
                f"{'hit':>8}{'/bound':>8}{'max/mean':>9}",
                file=out,
            )
            for f in table:
                ok, planned = sum(m.ok for m in f.runs), sum(m.planned for m in f.runs)
                itl = mean(f.over(lambda m: m.itl(50)))
                print(
                    f"    {f.target.label:28}{f'{ok}/{planned}':>9}"
                    f"{1000 * mean(f.ttft(50)):>8.0f}ms{1000 * mean(f.ttft(90)):>6.0f}ms"
                    f"{1000 * mean(f.ttft(99)):>6.0f}ms{1000 * itl:>5.1f}ms"
                    f"{pct(_mean_or_none(f.hit_rate)):>8}"
                    f"{ratio(_mean_or_none(f.hit_fraction)):>8}"
                    f"{ratio(_mean_or_none(f.balance)):>9}",
                    file=out,
                )
                for m in f.runs:
                    for p in shown_phases(m):
                        print(
                            f"      {p.name:26}{p.arrived:>5} arrived{p.good:>5} good "
                            f"{p.goodput:>6.2f}/s  TTFT p99 {1000 * p.ttft_p99_s:.0f}ms",
                            file=out,
                        )
    print("\nAcceptance checks", file=out)
    for check in result.checks:
        print(f"  {check.status:4}  {check.name}: {check.figures}", file=out)
    for line in notes(result):
        print(f"  {line}", file=out)
    print(f"\nTotal {result.duration_s / 60:.1f} min", file=out)


def _mean_or_none(value: Spread | None) -> float | None:
    return None if value is None else value.mean


def parse_seeds(text: str) -> tuple[int, ...]:
    """``0,1,2`` -> (0, 1, 2)."""
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are integers separated by commas: {text!r}"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError("at least one seed")
    return seeds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet",
        choices=("sim", "real", "mooncake", "all"),
        default="all",
        help="fleets to run: sim (the simulated fleets, the Mooncake replay included), real, "
        "mooncake (the Mooncake trace replay only), all (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller workloads, gateway-only real fleet (minutes)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="where benchmarks.md and the PNGs go"
    )
    parser.add_argument("--no-out", action="store_true", help="print only, write nothing")
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=DEFAULT_SEEDS,
        help="seeds of the workloads' text and arrivals, comma-separated: generated-shared-"
        "prefix, Zipf, overload and the real fleet's shared prefix run on each, the other "
        "workloads on the first; --quick uses the first only (default: the report seeds "
        f"{','.join(map(str, DEFAULT_SEEDS))}; parameters were tuned on "
        f"{','.join(map(str, TUNING_SEEDS))})",
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="never run bench/peers/install.sh or replica/vllm_cpu/install.sh; "
        "skip what is missing",
    )
    parser.add_argument("--no-peers", action="store_true", help="gateway targets only")
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="also run prefix-aware on its estimate only, the replicas' KV-cache events "
        "unread (prefix.source: estimate; what the events are worth)",
    )
    parser.add_argument(
        "--window",
        action="append",
        type=parse_window,
        metavar="TRACE:START-END",
        help="a window of a Mooncake trace to replay, in trace minutes (conversation:29-34, "
        "synthetic:10-15); repeat for several. Default: the shipped conversation:29-34. "
        "Outside it the whole traces are needed (--traces)",
    )
    parser.add_argument(
        "--window-set",
        choices=sorted(WINDOW_SETS),
        help="every window of a named set: report (the acceptance figures: "
        f"{', '.join(str(w) for w in REPORT_WINDOWS)}) or tuning "
        f"({', '.join(str(w) for w in TUNING_WINDOWS)})",
    )
    parser.add_argument(
        "--traces",
        metavar="FOLDER|download",
        help="where Mooncake's whole traces are: a folder holding conversation_trace.jsonl "
        f"and synthetic_trace.jsonl, or 'download' to fetch them once into {CACHE_DIR}/",
    )
    parser.add_argument(
        "--workloads",
        type=_workloads,
        metavar="NAMES",
        help="run only these of the simulated fleets' workloads, comma-separated, of: "
        f"{', '.join(SIM_WORKLOADS_NAMED)} (mooncake: the trace replay of --fleet sim); "
        "default: all. Spreads over many seeds: --fleet sim --workloads gsp --seeds 6,7,8,9,10",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


SIM_WORKLOADS_NAMED = (*SIM_FLEET_WORKLOADS, MOONCAKE)


def _workloads(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in SIM_WORKLOADS_NAMED]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown workload {', '.join(unknown) or text!r}; "
            f"choose from {', '.join(SIM_WORKLOADS_NAMED)}"
        )
    return names


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Entry point of ``llm-gateway bench compare``; 0 when every fleet ran to its end."""
    windows = tuple(args.window or ()) + WINDOW_SETS.get(args.window_set or "", ())
    config = CompareConfig(
        windows=tuple(dict.fromkeys(windows)) or (SHIPPED_WINDOW,),
        traces=args.traces,
        fleet=args.fleet,
        quick=args.quick,
        out=None if args.no_out else args.out,
        seeds=args.seeds,
        install=not args.no_install,
        peers=not args.no_peers,
        estimate=args.estimate,
        progress=not args.no_progress,
        workloads=args.workloads,
    )
    # Before anything starts (installing the peers included), in one line.
    replays = config.fleet == "mooncake" or (
        config.fleet in ("sim", "all") and config.runs(MOONCAKE)
    )
    problem = trace_problem(config.windows, config.traces) if replays else None
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    result = uvloop.run(run_compare(config))  # Ctrl-C: bench/cli.py's interruptible()
    print_summary(result, out)
    path = write_report(result, config, out)
    if path is not None:
        print(f"\nWrote {path} and its plots.", file=out)
    for fleet in result.failed:
        print(f"{fleet.title} failed: {fleet.skipped}", file=sys.stderr)
    return 1 if result.failed else 0
