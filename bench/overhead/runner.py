"""The measurement: one zero-delay replica, the routers in front of it, and interleaved
batches per cell with each process's CPU time read around its own batches."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import peers
from bench.driver import RequestResult, RunResult, run_plain
from bench.host import machine_description, process_cpu_s
from bench.launcher import start_gateway
from bench.overhead.config import (
    CACHE_AWARE_PEERS,
    CACHE_AWARE_POLICY,
    DIRECT,
    FEW_TOKENS,
    FLOOR,
    GATEWAY,
    MODEL,
    PACED,
    PEER_POLICY,
    PEERS,
    PREFIX_AWARE,
    ZERO_DELAY,
    Cell,
    ChunkCells,
    OverheadConfig,
    OverheadResult,
    Side,
    Target,
)
from bench.overhead.envoy_target import start_envoy_target
from bench.overhead.features import FEATURES, start_features
from bench.overhead.floor import start_floor
from bench.overhead.report import fmt
from bench.redis_server import start_redis
from replica.processes import ManagedProcess, ProcessStartError, start_sim_replicas


def one_pool(replica_url: str, policy: str = "round-robin") -> dict[str, Any]:
    """The bare gateway's policy: one pool, one replica, round-robin (or ``policy``)."""
    return {"pools": {"bench": {"model": MODEL, "replicas": [replica_url], "policy": policy}}}


def round_order(names: Sequence[str], round_index: int) -> tuple[str, ...]:
    """The targets' order in one round: rotated by one place per round, so each target takes
    every position equally often over ``len(names)`` rounds."""
    if not names:
        return ()
    shift = round_index % len(names)
    return (*names[shift:], *names[:shift])


def split_requests(total: int, rounds: int) -> list[int]:
    """``total`` requests over ``rounds`` batches, as even as whole numbers allow."""
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


def _add(total: float | None, start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return (total or 0.0) + end - start


def _router_cpu_s(target: Target) -> float | None:
    first = process_cpu_s(target.pid)
    if target.also_pid is None or first is None:
        return first
    second = process_cpu_s(target.also_pid)
    return None if second is None else first + second


async def _cell(
    targets: Sequence[Target],
    replica_pid: int | None,
    body: dict[str, Any],
    *,
    stream: bool,
    concurrency: int,
    total: int,
    rounds: int,
    timeout_s: float,
) -> Cell:
    by_name = {t.name: t for t in targets if t.measured}
    names = tuple(by_name)
    results: dict[str, list[RequestResult]] = {name: [] for name in names}
    walls = dict.fromkeys(names, 0.0)
    router_cpu: dict[str, float | None] = dict.fromkeys(names)
    replica_cpu: dict[str, float | None] = dict.fromkeys(names)

    async def batch(target: Target, requests: int) -> RunResult:
        assert target.url is not None
        key = target.api_key
        return await run_plain(
            target.url,
            dict(body, model=target.model),
            requests=requests,
            concurrency=concurrency,
            stream=stream,
            timeout_s=timeout_s,
            headers={"Authorization": f"Bearer {key}"} if key is not None else None,
        )

    # Unmeasured warm-up: connections, caches and allocator pools on every path.
    for name in names:
        await batch(by_name[name], 2 * concurrency)
    for i, count in enumerate(split_requests(total, rounds)):
        for name in round_order(names, i):
            target = by_name[name]
            router_before, replica_before = _router_cpu_s(target), process_cpu_s(replica_pid)
            run = await batch(target, count)
            router_after, replica_after = _router_cpu_s(target), process_cpu_s(replica_pid)
            results[name] += run.results
            walls[name] += run.wall_s
            router_cpu[name] = _add(router_cpu[name], router_before, router_after)
            replica_cpu[name] = _add(replica_cpu[name], replica_before, replica_after)
    sides = {
        name: Side(tuple(results[name]), walls[name], router_cpu[name], replica_cpu[name])
        for name in names
    }
    return Cell(stream, concurrency, sides)


async def start_peers(
    config: OverheadConfig, replica_url: str, policy: str = PEER_POLICY
) -> list[tuple[Target, ManagedProcess | None]]:
    """Each peer as a target running ``policy``, with its process (None where it was not
    started)."""
    names = PEERS if policy == PEER_POLICY else CACHE_AWARE_PEERS
    if not config.peers:
        return [(Target(name, status="skipped (--no-peers)"), None) for name in names]
    # A subprocess checks the venv's versions: off the event loop.
    problem = await asyncio.to_thread(peers.peers_available, config.peers_venv)
    if problem is not None:
        return [(Target(name, status="not installed", detail=problem), None) for name in names]
    started: list[tuple[Target, ManagedProcess | None]] = []
    for peer, name in zip(PEERS, names, strict=True):
        try:
            process = await peers.start_peer(peer, policy, [replica_url], venv=config.peers_venv)
        except Exception as exc:
            print(f"warning: {name} did not start: {exc}", file=sys.stderr)
            started.append((Target.failed_to_start(name, exc), None))
            continue
        started.append((Target(name, process.url, process.pid), process))
    return started


async def _peers(
    config: OverheadConfig,
    replica_url: str,
    processes: list[ManagedProcess],
    policy: str = PEER_POLICY,
) -> list[Target]:
    """The peers as targets in front of ``replica_url``, running ``policy``; the processes
    started join ``processes``."""
    targets = []
    for target, process in await start_peers(config, replica_url, policy):
        targets.append(target)
        if process is not None:
            processes.append(process)
    return targets


async def _other_python(
    config: OverheadConfig, policy: dict[str, Any], processes: list[ManagedProcess]
) -> Target:
    """The bare gateway run by ``config.gateway_python``, or why it was not measured."""
    name, python = config.other_python_target, str(config.gateway_python)
    try:
        gateway = await start_gateway(policy, python=python)
    except ProcessStartError as exc:
        return Target.failed_to_start(name, exc)
    processes.append(gateway)
    return Target(name, gateway.url, gateway.pid)


async def _python_version(python: Path) -> str:
    version = "import platform; print('Python', platform.python_version())"
    done = await asyncio.to_thread(
        subprocess.run, [str(python), "-c", version], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "version unknown"


async def _floor(replica_url: str, processes: list[ManagedProcess]) -> Target:
    floor = await start_floor(replica_url)
    processes.append(floor)
    return Target(FLOOR, floor.url, floor.pid)


async def _cache_aware(
    config: OverheadConfig, replica_url: str, processes: list[ManagedProcess]
) -> list[Target]:
    """The routing users run: this gateway with its default policy, the peers with theirs."""
    gateway = await start_gateway(one_pool(replica_url, "prefix-aware"))
    processes.append(gateway)
    gateway_target = Target(PREFIX_AWARE, gateway.url, gateway.pid)
    return [gateway_target, *await _peers(config, replica_url, processes, CACHE_AWARE_POLICY)]


def _progress(cell: Cell) -> None:
    figures = ", ".join(
        f"{name} {side.req_per_s:.0f} req/s p50 {fmt(side.latency_ms(50))} ms"
        for name, side in cell.sides.items()
    )
    print(f"{cell.mode}, concurrency {cell.concurrency}: {figures}", file=sys.stderr)


async def run_overhead(config: OverheadConfig) -> OverheadResult:
    """Start the zero-delay replica and the routers, measure every cell, stop them all."""
    started = datetime.now(UTC)
    processes: list[ManagedProcess] = []
    try:
        replicas = await start_sim_replicas(1, model=MODEL, **ZERO_DELAY)
        processes += replicas
        replica = replicas[0]
        policy = one_pool(replica.url)
        gateway = await start_gateway(policy)
        processes.append(gateway)
        targets = [Target(DIRECT, replica.url), Target(GATEWAY, gateway.url, gateway.pid)]
        if config.gateway_python is not None:
            targets.append(await _other_python(config, policy, processes))
        redis = None
        if config.workers > 1 or config.features:
            try:
                redis = await start_redis()
                processes.append(redis)
            except ProcessStartError as exc:
                if config.workers > 1:
                    raise
                targets.append(Target(FEATURES, status="not measured", detail=str(exc)))
        if config.features and redis is not None:
            features = await start_features(replica.url, redis.url, processes)
            targets.append(features)
        if config.workers > 1:
            assert redis is not None
            env = {"GATEWAY_WORKERS": str(config.workers)}
            # Its own key prefix: the features target's traffic is no business of its.
            through_redis = {"GATEWAY_REDIS_URL": redis.url, "GATEWAY_STATE_KEY_PREFIX": "workers"}
            for name, extra in zip(config.workers_targets, ({}, through_redis), strict=True):
                workers = await start_gateway(policy, env={**env, **extra})
                processes.append(workers)
                # The parent's CPU figure sums its descendants: every worker.
                targets.append(Target(name, workers.url, workers.pid))
        if config.envoy:
            targets.append(await start_envoy_target(policy, processes))
        if config.floor:
            targets.append(await _floor(replica.url, processes))
        targets += await _peers(config, replica.url, processes)
        if config.cache_aware:
            targets += await _cache_aware(config, replica.url, processes)
        plan = [(config.concurrency, config.requests)]
        if config.unloaded_requests and config.concurrency != 1:
            plan.append((1, config.unloaded_requests))
        cells = []
        for stream in (False, True):
            for concurrency, total in plan:
                cell = await _cell(
                    targets,
                    replica.pid,
                    config.body(),
                    stream=stream,
                    concurrency=concurrency,
                    total=total,
                    rounds=config.rounds,
                    timeout_s=config.timeout_s,
                )
                _progress(cell)
                cells.append(cell)
        chunks = await _chunk_cells(config, processes) if config.chunk_tokens else None
    finally:
        # Shielded: after Ctrl-C cancels this task, the children must still be stopped.
        await asyncio.shield(asyncio.gather(*(p.stop() for p in processes), return_exceptions=True))
    machine = machine_description()
    if config.gateway_python is not None:
        machine += f"; {config.other_python_target}: {await _python_version(config.gateway_python)}"
    return OverheadResult(config, tuple(targets), tuple(cells), started, machine, chunks)


async def _chunk_cells(config: OverheadConfig, processes: list[ManagedProcess]) -> ChunkCells:
    """Streaming from a replica that paces its tokens, through the gateway and the peers
    started anew in front of it: requests of FEW_TOKENS and of ``chunk_tokens``."""
    [paced] = await start_sim_replicas(1, model=MODEL, **PACED)
    processes.append(paced)
    gateway = await start_gateway(one_pool(paced.url))
    processes.append(gateway)
    targets = [Target(DIRECT, paced.url), Target(GATEWAY, gateway.url, gateway.pid)]
    if config.floor:
        targets.append(await _floor(paced.url, processes))
    targets += await _peers(config, paced.url, processes)
    requests = max(config.requests // 16, config.concurrency * config.rounds)
    few, many = [
        await _cell(
            targets,
            paced.pid,
            dict(config.body(), max_tokens=tokens),
            stream=True,
            concurrency=config.concurrency,
            total=requests,
            rounds=config.rounds,
            timeout_s=config.timeout_s,
        )
        for tokens in (FEW_TOKENS, config.chunk_tokens)
    ]
    return ChunkCells(few, many)
