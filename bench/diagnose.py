"""``llm-gateway bench diagnose``: where a Mooncake window's cache hits went, request by request.

Replays one trace window on the Mooncake fleet of ``bench compare`` (8 simulated replicas
with its KV size), target by target, and for each run prints the fleet's figures (hit rate,
the affinity bound, TTFT), the figures per route, and a model of the replicas' caches
replaying the run's own decisions: an LRU of trace blocks per replica, as many as the sims' KV
cache holds. Which replica served a request is in the gateway's x-gateway-replica header, and,
through the peer routers, in the sim's response id (bench/driver.py). The model answers what the
measured hit rate cannot: how much the replicas chosen held (it should match the measured rate),
how much the best replica at each request held (what following every history would have
served), how much unbounded caches would have held (the placements' ceiling), and how many
requests were sent away from a replica holding more of their history, and what that cost.

``--set KEY=VALUE`` overrides the gateway pool's policy for the run (``cost.copy_weight=10``),
so the effect of a routing constant is measured the way it was chosen; ``--sim KEY=VALUE`` the
simulated replicas' settings (``kv_offload_blocks=12288``: a CPU tier twice the KV cache).
``--runs N`` repeats the replay, the targets taking turns going first, and ends with each
target's spread over the runs (min-max and mean of hit / bound, TTFT p90 and p99) and the
difference of the means of hit / bound against twice its standard error, so a difference can
be told from run-to-run noise. ``--dump DIR`` writes each run's requests as JSON lines. Meant
for tuning windows: acceptance figures come from ``bench compare`` on the report set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop
import yaml
from pydantic import ValidationError

from bench.compare.mooncake import (
    LENGTH_SCALE,
    MOONCAKE_SIM,
    REPORT_WINDOWS,
    TraceWindow,
    mooncake_config,
    mooncake_workload,
    parse_window,
    trace_path,
    trace_problem,
)
from bench.compare.plan import (
    DEFAULT_SEEDS,
    SIM_MODEL,
    SIM_REPLICAS,
    TUNING_SEEDS,
    PlannedWorkload,
)
from bench.compare.results import (
    ESTIMATE_TARGET,
    PREFIX_AWARE,
    SGLANG_CA,
    VLLM_CA,
    Measurement,
    Target,
)
from bench.compare.runner import SIM_TIMEOUT_S, measure, stop_all, warm_up
from bench.driver import RequestResult, RunResult, percentile
from bench.replica_counters import max_over_mean
from bench.workloads_mooncake import (
    TRACE_BLOCK_TOKENS,
    TraceRecord,
    lru_remember,
    read_trace,
    reused_blocks,
    reused_tokens,
)
from gateway.cli_types import positive_int
from replica.processes import LOCAL_KV_EVENTS, start_sim_replicas
from replica.sim.config import SimConfig

TARGETS: dict[str, Target] = {
    "prefix-aware": PREFIX_AWARE,
    "prefix-aware-estimate": ESTIMATE_TARGET,
    "vllm-router": VLLM_CA,
    "sglang-router": SGLANG_CA,
}
"""The gateway's prefix-aware routing (on the replicas' KV events, or its estimate only) and the
peers' cache_aware policies."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window", type=parse_window, required=True, help="TRACE:START-END, as bench compare's"
    )
    parser.add_argument(
        "--traces", default="download", help="folder of the whole traces, or download"
    )
    parser.add_argument(
        "--targets",
        type=_targets,
        default="prefix-aware",
        help="comma-separated, of: " + ", ".join(TARGETS) + " (default: %(default)s)",
    )
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a gateway pool setting for the runs (YAML value), e.g. cost.copy_weight=10",
    )
    parser.add_argument(
        "--sim",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a simulated replica setting for the runs (replica/sim/config.py), e.g. "
        "kv_offload_blocks=12288 (a CPU tier twice the GPU cache)",
    )
    parser.add_argument("--runs", type=positive_int, default=1)
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="block texts; default: what bench compare draws them with, the first report seed "
        f"({DEFAULT_SEEDS[0]}) on a report window, the first tuning seed ({TUNING_SEEDS[0]}) "
        "on any other",
    )
    parser.add_argument("--dump", type=Path, default=None, help="write each run's requests")


def compare_seed(window: TraceWindow) -> int:
    """The seed bench compare replays ``window`` with: another draw of block texts moves a
    window's figures by about their run-to-run spread."""
    return DEFAULT_SEEDS[0] if window in REPORT_WINDOWS else TUNING_SEEDS[0]


def _targets(text: str) -> list[Target]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TARGETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown target {', '.join(unknown) or repr(text)}; choose from {', '.join(TARGETS)}"
        )
    return [TARGETS[name] for name in names]


def _setting(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return text


def overrides(settings: Iterable[str]) -> dict[str, Any]:
    """``a.b=1`` settings as the nested pool mapping ``{"a": {"b": 1}}``."""
    pool: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"{setting!r} is not KEY=VALUE")
        *parents, leaf = key.split(".")
        node = pool
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    return pool


@dataclass(frozen=True, slots=True)
class CacheModel:
    """What an LRU of ``capacity`` trace blocks per replica held for each request, replaying
    the replicas chosen (shares of the window's prompt tokens)."""

    chosen: float
    best: float
    unbounded: float
    sent_away: int
    """Requests sent to a replica holding fewer blocks than another (more than the trace's
    shared first block)."""
    sent_away_share: float
    """The prompt tokens those requests could have had from the better replica."""


def cache_model(
    records: Mapping[str, TraceRecord], results: Sequence[RequestResult], capacity: int
) -> CacheModel:
    caches: dict[str, OrderedDict[int, None]] = {}
    every: dict[str, set[int]] = {}
    total = chosen = best = unbounded = lost = 0
    away = 0
    for result in results:
        record = records.get(result.conversation)
        if record is None or result.replica is None:
            continue
        held = {name: reused_blocks(record, cache) for name, cache in caches.items()}
        most = max(held.values(), default=0)
        mine = held.get(result.replica, 0)
        total += record.input_length
        chosen += reused_tokens(record, mine)
        best += reused_tokens(record, most)
        unbounded += reused_tokens(record, reused_blocks(record, every.get(result.replica, set())))
        if most > 1 and mine < most:
            away += 1
            lost += reused_tokens(record, most) - reused_tokens(record, mine)
        lru_remember(caches.setdefault(result.replica, OrderedDict()), record, capacity)
        every.setdefault(result.replica, set()).update(record.hash_ids)
    share = 1 / max(total, 1)
    return CacheModel(chosen * share, best * share, unbounded * share, away, lost * share)


def records_by_id(path: Path, workload: PlannedWorkload) -> dict[str, TraceRecord]:
    """The trace records of the workload's requests, by request id (``m`` and the line)."""
    wanted = {c.id for c in workload.conversations}
    return {
        f"m{line:06d}": record
        for line, record in enumerate(read_trace(path))
        if f"m{line:06d}" in wanted
    }


def capacity_blocks() -> int:
    """The sims' KV cache in trace blocks (a trace block is LENGTH_SCALE x 512 tokens)."""
    config = mooncake_config()
    return int(config.num_blocks * config.block_size / (TRACE_BLOCK_TOKENS * LENGTH_SCALE))


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run's headline figures, those the acceptance checks read."""

    hit_bound: float
    ttft_p90_ms: float
    ttft_p99_ms: float


def figures(measurement: Measurement) -> RunFigures:
    m = measurement
    hit = m.cache_hits / max(m.cache_queries, 1)
    ttfts = sorted(m.ttfts)
    return RunFigures(
        hit / max(m.bound.bound, 1e-9),
        1000 * percentile(ttfts, 90),
        1000 * percentile(ttfts, 99),
    )


def spread(runs: Mapping[str, Sequence[RunFigures]]) -> str:
    """Each target's figures over the runs, min-max (mean), and the first target's hit / bound
    against each other's: the difference of the means beside twice its standard error (Welch),
    within which the runs cannot tell the two apart."""

    def over(values: Sequence[float], digits: int) -> str:
        return (
            f"{min(values):.{digits}f}-{max(values):.{digits}f} "
            f"(mean {statistics.fmean(values):.{digits}f})"
        )

    def error(values: Sequence[float]) -> float:
        return statistics.variance(values) / len(values) if len(values) > 1 else math.inf

    lines = []
    for label, rows in runs.items():
        lines.append(
            f"{label}, {len(rows)} runs: hit/bound {over([r.hit_bound for r in rows], 3)}; "
            f"TTFT p90 {over([r.ttft_p90_ms for r in rows], 0)} ms, "
            f"p99 {over([r.ttft_p99_ms for r in rows], 0)} ms"
        )
    first, *others = runs
    mine = [r.hit_bound for r in runs[first]]
    for other in others:
        theirs = [r.hit_bound for r in runs[other]]
        gap = statistics.fmean(mine) - statistics.fmean(theirs)
        twice = 2 * math.sqrt(error(mine) + error(theirs))
        verdict = "within it: a tie at this many runs" if abs(gap) <= twice else "beyond it"
        lines.append(
            f"hit/bound, {first} - {other}: {gap:+.3f} in the means, twice its standard error "
            f"{twice:.3f}; {verdict}"
        )
    return "\n".join(lines)


def _max_over_mean(values: Sequence[float]) -> str:
    ratio = max_over_mean(values)
    return "-" if ratio is None else f"{ratio:.2f}"


def describe(label: str, measurement: Measurement, run: RunResult, model: CacheModel | None) -> str:
    m = measurement
    hit = m.cache_hits / max(m.cache_queries, 1)
    f = figures(measurement)
    lines = [
        f"{label}: hit {hit:.3f}, bound {m.bound.bound:.3f}, hit/bound {f.hit_bound:.3f}; "
        f"TTFT p50/p90/p99 {1000 * percentile(sorted(m.ttfts), 50):.0f}/{f.ttft_p90_ms:.0f}/"
        f"{f.ttft_p99_ms:.0f} ms; {m.sent - m.errors}/{m.planned} answered",
        f"  per replica, max/mean: requests {_max_over_mean(m.requests_per_replica)}, "
        f"prompt tokens prefilled {_max_over_mean(m.prefilled_per_replica)}",
    ]
    routes: dict[str, list[RequestResult]] = {}
    for result in run.results:
        if result.route is not None:
            routes.setdefault(result.route, []).append(result)
    for route, results in sorted(routes.items(), key=lambda item: -len(item[1])):
        cached = sum(r.cached_tokens for r in results)
        prompt = sum(r.prompt_tokens for r in results)
        lines.append(f"  route {route}: {len(results)} requests, hit {cached / max(prompt, 1):.3f}")
    if model is not None:
        lines.append(
            f"  cache model: chosen replicas held {model.chosen:.3f}, the best replica each "
            f"time {model.best:.3f}, unbounded caches {model.unbounded:.3f}; "
            f"{model.sent_away} requests sent away from more of their history "
            f"({model.sent_away_share:.3f} of the prompt tokens)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # Before the eight replicas start: a trace not there, or a misspelt --sim setting.
    problem = trace_problem([args.window], args.traces)
    try:
        SimConfig.model_validate({**MOONCAKE_SIM, **overrides(args.sim)})
    except ValidationError as exc:
        first = exc.errors()[0]
        problem = problem or f"--sim: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    uvloop.run(_diagnose(args))
    return 0


async def _diagnose(args: argparse.Namespace) -> None:
    window = args.window
    path = trace_path(window, args.traces)
    seed = args.seed if args.seed is not None else compare_seed(window)
    workload = mooncake_workload(window, traces=args.traces, seed=seed)
    pool = overrides(args.set)
    workload = dataclasses.replace(workload, gateway_pool=pool)
    targets: list[Target] = args.targets
    records = records_by_id(path, workload)
    capacity = capacity_blocks()
    print(f"{window}, seed {seed}: {len(records)} requests; cache model {capacity} blocks each")
    if pool:
        print(f"gateway pool settings: {json.dumps(pool)}")
    sim_settings = overrides(args.sim)
    sim = {**MOONCAKE_SIM, **sim_settings}
    if sim_settings:
        print(f"replica settings: {json.dumps(sim_settings)}")
    replicas = await start_sim_replicas(
        SIM_REPLICAS, model=SIM_MODEL, **sim, kv_events_config=LOCAL_KV_EVENTS
    )
    live = list(replicas)
    urls = [r.url for r in replicas]
    try:
        await warm_up(urls, SIM_MODEL)
        seen: dict[str, list[RunFigures]] = {t.label: [] for t in targets}
        for turn in range(args.runs):
            # Each run another target goes first, as in bench compare: none always runs on the
            # freshest machine.
            shift = turn % len(targets)
            for target in targets[shift:] + targets[:shift]:
                runs: list[RunResult] = []
                measurement = await measure(
                    target, workload, urls, SIM_MODEL, timeout_s=SIM_TIMEOUT_S, live=live,
                    on_run=runs.append,
                )  # fmt: skip
                ordered = _in_arrival_order(runs[0], workload)
                named = any(r.replica is not None for r in ordered)
                model = cache_model(records, ordered, capacity) if named else None
                print(describe(f"run {turn + 1} {target.label}", measurement, runs[0], model))
                seen[target.label].append(figures(measurement))
                if args.dump is not None:
                    _dump(args.dump / f"run{turn + 1}-{target.kind}-{target.policy}.jsonl", runs[0])
        if args.runs > 1:
            print(spread(seen))
    finally:
        await stop_all(live)


def _in_arrival_order(run: RunResult, workload: PlannedWorkload) -> list[RequestResult]:
    arrivals = workload.arrivals or [0.0] * len(workload.conversations)
    at = {c.id: t for c, t in zip(workload.conversations, arrivals, strict=True)}
    return sorted(run.results, key=lambda r: (at.get(r.conversation, 0.0), r.conversation))


def _dump(path: Path, run: RunResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for r in run.results:
            out.write(
                orjson.dumps(
                    {
                        "id": r.conversation,
                        "replica": r.replica,
                        "route": r.route,
                        "cached": r.cached_tokens,
                        "prompt": r.prompt_tokens,
                        "ttft": r.ttft_s,
                    }
                )
                + b"\n"
            )
