"""One runner for both fleets: every target on every workload, each from emptied caches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from bench import peers
from bench.affinity import affinity_bound_with_tools
from bench.compare.phases import PhaseFigures, phase_figures
from bench.compare.plan import SIM_MODEL, SIM_REPLICAS, PlannedWorkload
from bench.compare.results import (
    FleetResult,
    Measurement,
    Target,
    summarize,
)
from bench.driver import CHAT_PATH, RunResult, run_conversations
from bench.launcher import start_gateway
from bench.replica_counters import (
    delta,
    reset_and_verify,
    wait_quiet,
)
from replica.processes import (
    LOCAL_KV_EVENTS,
    ManagedProcess,
    kv_event_endpoints,
    start_sim_replicas,
)

CONCURRENCY_CAP = 1024
"""The driver's bound on requests in flight: far above what any run reaches, so load stays
open-loop (arrivals never wait for earlier requests)."""
SIM_TIMEOUT_S = 60.0
REAL_TIMEOUT_S = 180.0


async def start_target(
    target: Target, urls: Sequence[str], model: str, pool: Mapping[str, Any] | None = None
) -> ManagedProcess:
    """The target's router in front of ``urls``, ready to route; ``pool``: more settings of
    the gateway's pool."""
    if target.kind == "gateway":
        settings = {"model": model, "replicas": list(urls), "policy": target.policy, **(pool or {})}
        # Every fleet here publishes KV-cache events (run_fleet's replicas are started so): a
        # target told prefix.source auto or events reads them.
        prefix = {**settings.get("prefix", {}), "events": {"endpoints": kv_event_endpoints(urls)}}
        if target.source is not None:
            prefix["source"] = target.source
        settings["prefix"] = prefix
        if target.objective_s is not None:
            cost = {**settings.get("cost", {}), "ttft_objective_s": target.objective_s}
            settings["cost"] = cost
        return await start_gateway({"pools": {"bench": settings}})
    return await peers.start_peer(target.kind, target.policy, urls)


async def stop_all(processes: Sequence[ManagedProcess]) -> None:
    # Shielded: after Ctrl-C cancels the run, the children must still be stopped.
    stops = asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
    await asyncio.shield(stops)


async def measure(
    target: Target,
    workload: PlannedWorkload,
    urls: Sequence[str],
    model: str,
    *,
    timeout_s: float,
    live: list[ManagedProcess],
    on_run: Callable[[RunResult], None] | None = None,
) -> Measurement:
    """One target through one workload, from emptied caches; the router is stopped after.
    ``on_run`` sees every request's result (bench diagnose)."""
    router = await start_target(target, urls, model, workload.gateway_pool)
    live.append(router)
    try:
        before = await reset_and_verify(urls)
        run = await run_conversations(
            router.url,
            workload.conversations,
            model=model,
            concurrency=workload.concurrency or CONCURRENCY_CAP,
            timeout_s=timeout_s,
            arrivals=workload.arrivals,
            progress=False,
        )
    finally:
        await stop_all([router])
        live.remove(router)
    after = await wait_quiet(urls, timeout_s)
    if on_run is not None:
        on_run(run)
    bound = affinity_bound_with_tools((r.messages, r.tools) for r in run.results)
    phases: tuple[PhaseFigures, ...] = ()
    if workload.phases is not None and workload.arrivals is not None:
        starts = {c.id: at for c, at in zip(workload.conversations, workload.arrivals, strict=True)}
        phases = phase_figures(run.results, starts, workload.phases)
    return summarize(
        target,
        workload.info.key,
        run,
        delta(before, after),
        urls,
        bound,
        seed=workload.seed,
        phases=phases,
    )


async def warm_up(urls: Sequence[str], model: str) -> None:
    """One short request straight to each replica, so no target pays a replica's first-request
    costs; the caches are emptied before every target anyway."""
    body = orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
    )
    timeout = aiohttp.ClientTimeout(total=REAL_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            async with session.post(
                url + CHAT_PATH, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                response.raise_for_status()
                await response.read()


async def rehearse(
    urls: Sequence[str], model: str, workloads: Sequence[PlannedWorkload], timeout_s: float
) -> None:
    """Every replica serves each workload's prompts once, one at a time, untimed (the caches
    are emptied before every target): a vLLM engine's first prefills of each prompt length are
    slower than later ones, and ``warm_up``'s one short request does not cover them, so the
    first target measured would pay them."""

    async def serve_all(url: str) -> None:
        for workload in workloads:
            run = await run_conversations(
                url, workload.conversations, model=model, concurrency=1,
                timeout_s=timeout_s, progress=False,
            )  # fmt: skip
            _raise_on_failures(run, f"rehearsal on {url}")

    await asyncio.gather(*(serve_all(url) for url in urls))
    # Requests that overlap are batched into shapes no single request makes, and an engine's
    # first batch of a shape is slower too: once, the workloads as they will arrive, each
    # request to a replica at random, so the first target measured does not pay for them.
    for workload in workloads:
        run = await run_conversations(
            urls[0], workload.conversations, model=model, concurrency=CONCURRENCY_CAP,
            timeout_s=timeout_s, arrivals=workload.arrivals, progress=False, spread=urls[1:],
        )  # fmt: skip
        _raise_on_failures(run, "rehearsal at the workloads' arrival times")


def _raise_on_failures(run: RunResult, what: str) -> None:
    if run.failed:
        raise RuntimeError(f"{what}: {run.failed} requests failed")


def measuring_order(targets: Sequence[Target], turn: int) -> list[Target]:
    """The targets in the order they are measured on the fleet's ``turn``-th workload run (a
    seed, a trace window): the listed order rotated by ``turn``, so the first measured (the one
    after the fleet's start or after another workload) is not always the same target."""
    start = turn % len(targets) if targets else 0
    return [*targets[start:], *targets[:start]]


async def run_targets(
    fleet: FleetResult,
    urls: Sequence[str],
    model: str,
    workloads: Sequence[PlannedWorkload],
    *,
    timeout_s: float,
    live: list[ManagedProcess],
    bar: tqdm[Any] | None,
) -> None:
    # Rotated over the fleet's whole plan, not per workload: a workload run once (a trace
    # window, multi-round QA) would otherwise always measure the first listed target first.
    for turn, workload in enumerate(workloads):
        if fleet.workload(workload.info.key) is None:
            fleet.workloads.append(workload.info)
        for target in measuring_order(fleet.targets, turn):
            if bar is not None:
                name = f"{workload.info.key} seed {workload.seed}"
                bar.set_postfix_str(f"{fleet.key} {name}: {target.label}")
            fleet.measurements.append(
                await measure(target, workload, urls, model, timeout_s=timeout_s, live=live)
            )
            if bar is not None:
                bar.update()


async def run_fleet(
    fleet: FleetResult,
    start_replicas: Callable[[], Awaitable[Sequence[ManagedProcess]]],
    model: str,
    workloads: Sequence[PlannedWorkload],
    *,
    timeout_s: float,
    bar: tqdm[Any] | None,
    rehearsal: bool = False,
) -> FleetResult:
    """Start the fleet's replicas, run every target on every workload, stop everything;
    ``rehearsal``: each replica serves the workloads once before the first target (real vLLM),
    which also covers the one-request warm-up the other fleets get."""
    started = time.perf_counter()
    live: list[ManagedProcess] = []
    try:
        replicas = await start_replicas()
        live += replicas
        urls = [replica.url for replica in replicas]
        if rehearsal:
            await rehearse(urls, model, workloads, timeout_s)
        else:
            await warm_up(urls, model)
        await run_targets(fleet, urls, model, workloads, timeout_s=timeout_s, live=live, bar=bar)
    finally:
        await stop_all(live)
    fleet.wall_s = time.perf_counter() - started
    return fleet


@dataclass(frozen=True, slots=True)
class SimVariant:
    """A fleet of simulated replicas with settings of their own (the rest default)."""

    key: str
    title: str
    """Its section's title; the replica count is added."""
    describe: Callable[[int], list[str]]
    """Its section's description lines, for a number of replicas."""
    sim_settings: Mapping[str, Any]


async def run_sim_variant(
    variant: SimVariant,
    workloads: Sequence[PlannedWorkload],
    targets: Sequence[Target],
    *,
    replicas: int = SIM_REPLICAS,
    skipped_targets: dict[str, str] | None = None,
    bar: tqdm[Any] | None = None,
) -> FleetResult:
    """``run_fleet`` on the variant's simulated replicas."""
    fleet = FleetResult(
        variant.key,
        f"{variant.title} ({replicas} replicas)",
        variant.describe(replicas),
        targets=list(targets),
        skipped_targets=dict(skipped_targets or {}),
    )
    return await run_fleet(
        fleet,
        lambda: start_sim_replicas(
            replicas, model=SIM_MODEL, **variant.sim_settings, kv_events_config=LOCAL_KV_EVENTS
        ),
        SIM_MODEL,
        workloads,
        timeout_s=SIM_TIMEOUT_S,
        bar=bar,
    )
