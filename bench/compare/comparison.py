"""The whole comparison: which targets run on which fleet, and the checks on the results."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from bench import peers
from bench.compare.agents import AGENTS_VARIANT, agents_workload
from bench.compare.checks import Check, mooncake_checks, overload_checks, real_checks, sim_checks
from bench.compare.code_state import CodeState
from bench.compare.fleets import REAL_TITLE, prepare_real_fleet, run_real_fleet, run_sim_fleet
from bench.compare.mooncake import (
    MOONCAKE_VARIANT,
    OBJECTIVE_TARGET,
    REPORT_WINDOWS,
    SHIPPED_WINDOW,
    TraceWindow,
    mooncake_workload,
)
from bench.compare.overload import OVERLOAD_OBJECTIVE_TARGET, OVERLOAD_VARIANT, overload_workload
from bench.compare.plan import (
    AGENTS,
    DEFAULT_SEEDS,
    MOONCAKE,
    OVERLOAD,
    PlannedWorkload,
    SimScale,
    over_seeds,
    real_workloads,
    sim_workloads,
)
from bench.compare.results import (
    CACHE_AWARE_PEERS,
    ESTIMATE_TARGET,
    GATEWAY_TARGETS,
    PEER_TARGETS,
    PREFIX_AWARE,
    ROUND_ROBIN,
    FleetResult,
    Target,
)
from bench.compare.runner import SimVariant, run_sim_variant


@dataclass(frozen=True, slots=True)
class CompareConfig:
    fleet: str = "all"
    quick: bool = False
    out: Path | None = Path("docs")
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    """Generated-shared-prefix, Zipf, overload and the real fleet's shared prefix run on each
    (--quick: the first only); the other workloads on the first."""
    install: bool = True
    peers: bool = True
    progress: bool = True
    windows: tuple[TraceWindow, ...] = (SHIPPED_WINDOW,)
    """The Mooncake trace windows replayed (the mooncake fleet)."""
    traces: str | None = None
    """Where the whole traces are (a folder, or "download"); None: the shipped window only."""
    estimate: bool = False
    """Also run prefix-aware on its estimate only (prefix.source: estimate)."""
    workloads: tuple[str, ...] | None = None
    """The simulated fleets' workloads to run (plan.SIM_FLEET_WORKLOADS); None: all."""

    def runs(self, workload: str) -> bool:
        return self.workloads is None or workload in self.workloads

    def command(self) -> str:
        parts = ["llm-gateway bench compare", f"--fleet {self.fleet}"]
        if self.quick:
            parts.append("--quick")
        if self.seeds != DEFAULT_SEEDS:
            parts.append(f"--seeds {','.join(str(s) for s in self.seeds)}")
        if self.windows != (SHIPPED_WINDOW,):
            parts += [f"--window {w}" for w in self.windows]
        if self.traces is not None:
            parts.append(f"--traces {self.traces}")
        if not self.peers:
            parts.append("--no-peers")
        if self.estimate:
            parts.append("--estimate")
        if self.workloads is not None:
            parts.append(f"--workloads {','.join(self.workloads)}")
        parts.append(f"--out {self.out}" if self.out is not None else "--no-out")
        return " ".join(parts)


@dataclass(slots=True)
class CompareResult:
    fleets: list[FleetResult]
    checks: list[Check]
    peers: str
    duration_s: float
    code: CodeState | None = None
    """The code when the run started."""

    @property
    def failed(self) -> list[FleetResult]:
        """Fleets whose run raised (their sections say why)."""
        return [fleet for fleet in self.fleets if fleet.failed]


def _peer_targets(config: CompareConfig, out: TextIO) -> tuple[str | None, str]:
    """(why peers cannot run or None, the peers line of the report)."""
    if not config.peers:
        return "left out (--no-peers)", "left out (--no-peers)"
    reason = peers.peers_available()
    if reason is not None and config.install:
        print(f"[compare] peers missing ({reason}); running {peers.INSTALL_SCRIPT.name}", file=out)
        failed = peers.install_peers()
        reason = failed if failed is not None else peers.peers_available()
    if reason is not None:
        return reason, f"not run: {reason}"
    versions = ", ".join(f"{name} {version}" for name, version in peers.VERSIONS.items())
    return None, f"{versions} (bench/peers/install.sh, flags in bench/peers/__init__.py)"


async def _fleet_or_failure(
    key: str, title: str, run: Awaitable[FleetResult], out: TextIO
) -> FleetResult:
    """The fleet's result, or, when it raised, a fleet that says so: the fleets measured
    before and after it are still reported (a full run is an hour)."""
    try:
        return await run
    except Exception as error:
        print(f"[compare] {title} failed: {error!r}", file=out)
        return FleetResult(key, title, skipped=f"failed: {error!r}", failed=True)


async def run_compare(config: CompareConfig, out: TextIO = sys.stderr) -> CompareResult:
    started = time.perf_counter()
    code = CodeState.now()
    peer_reason, peers_line = _peer_targets(config, out)
    fleets: list[FleetResult] = []
    checks: list[Check] = []
    sim_targets = list(GATEWAY_TARGETS)
    real_targets = [PREFIX_AWARE, ROUND_ROBIN]
    if config.estimate:
        sim_targets.insert(1, ESTIMATE_TARGET)
        real_targets.insert(1, ESTIMATE_TARGET)
    skipped: dict[str, str] = {}
    if peer_reason is None:
        sim_targets += PEER_TARGETS
        if not config.quick:
            real_targets += CACHE_AWARE_PEERS
    else:
        skipped = {t.label: peer_reason for t in PEER_TARGETS}
    run_sim = config.fleet in ("sim", "all")
    run_mooncake = config.fleet == "mooncake" or (
        config.fleet in ("sim", "all") and config.runs(MOONCAKE)
    )
    run_real = config.fleet in ("real", "all")
    scale = SimScale.quick() if config.quick else SimScale()
    seeds = config.seeds[:1] if config.quick else config.seeds
    sim_plan = [w for w in sim_workloads(scale, seeds) if config.runs(w.info.key)]
    agents_plan = [agents_workload(config.quick, seeds[0])] if config.runs(AGENTS) else []
    overload_plan = (
        over_seeds(lambda seed: [overload_workload(config.quick, seed)], seeds)
        if config.runs(OVERLOAD)
        else []
    )
    mooncake_plan = (
        [
            mooncake_workload(w, traces=config.traces, quick=config.quick, seed=seeds[0])
            for w in config.windows
        ]
        if run_mooncake
        else []
    )
    mooncake_targets = [*sim_targets, OBJECTIVE_TARGET]
    overload_targets = [*sim_targets, OVERLOAD_OBJECTIVE_TARGET]
    real_plan = real_workloads(config.quick, seeds)
    model_dir, real_reason = (Path(), None)
    if run_real:
        model_dir, real_reason = prepare_real_fleet(config.install, out)
        if real_reason is not None:
            print(f"[compare] real vLLM fleet skipped: {real_reason}", file=out)
    sim_runs = (len(sim_plan) + len(agents_plan)) * len(sim_targets)
    total = (
        (sim_runs + len(overload_plan) * len(overload_targets) if run_sim else 0)
        + len(mooncake_plan) * len(mooncake_targets)
        + (len(real_plan) * len(real_targets) if run_real and real_reason is None else 0)
    )
    with tqdm(total=total, unit="run", desc="compare", disable=not config.progress) as bar:

        async def variant(
            v: SimVariant, plan: list[PlannedWorkload], targets: list[Target]
        ) -> FleetResult:
            run = run_sim_variant(v, plan, targets, skipped_targets=skipped, bar=bar)
            return await _fleet_or_failure(v.key, v.title, run, out)

        if run_sim and sim_plan:
            sim = await _fleet_or_failure(
                "sim",
                "Simulated fleet",
                run_sim_fleet(sim_plan, sim_targets, scale=scale, skipped_targets=skipped, bar=bar),
                out,
            )
            fleets.append(sim)
            checks += sim_checks(sim)
        if run_sim and agents_plan:
            fleets.append(await variant(AGENTS_VARIANT, agents_plan, sim_targets))
        if run_sim and overload_plan:
            heavy = await variant(OVERLOAD_VARIANT, overload_plan, overload_targets)
            fleets.append(heavy)
            checks += overload_checks(heavy)
        if run_mooncake:
            mooncake = await variant(MOONCAKE_VARIANT, mooncake_plan, mooncake_targets)
            fleets.append(mooncake)
            checks += mooncake_checks(mooncake, {w.key for w in REPORT_WINDOWS})
        if run_real:
            if real_reason is None:
                real_skipped = (
                    {t.label: peer_reason for t in CACHE_AWARE_PEERS} if peer_reason else {}
                )
                if config.quick and peer_reason is None:
                    real_skipped = {t.label: "left out by --quick" for t in CACHE_AWARE_PEERS}
                real = await _fleet_or_failure(
                    "real",
                    REAL_TITLE,
                    run_real_fleet(
                        real_plan, real_targets, model_dir, skipped_targets=real_skipped, bar=bar
                    ),
                    out,
                )
            else:
                real = FleetResult("real", REAL_TITLE, skipped=real_reason)
            fleets.append(real)
            checks += real_checks(real)
    return CompareResult(fleets, checks, peers_line, time.perf_counter() - started, code)
