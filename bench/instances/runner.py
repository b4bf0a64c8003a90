"""One fleet, several gateway layouts: each workload through N gateway instances, every request
sent to one of them at random, from emptied caches; figures from the replicas' own counters."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from bench.affinity import affinity_bound_with_tools
from bench.compare.plan import SIM_MODEL, PlannedWorkload
from bench.compare.results import PREFIX_AWARE, Measurement, summarize
from bench.compare.runner import CONCURRENCY_CAP, SIM_TIMEOUT_S, stop_all, warm_up
from bench.driver import run_conversations
from bench.launcher import start_gateway
from bench.redis_server import start_redis
from bench.replica_counters import delta, reset_and_verify, wait_quiet
from gateway.telemetry.metrics import STATE_APPLY_LAG
from replica.processes import ManagedProcess, start_sim_replicas


@dataclass(frozen=True, slots=True)
class Layout:
    instances: int
    shared: bool
    """Through Redis (the redis backend); else local: each instance on its own, and the
    workers of one instance with each other (without Redis)."""
    workers: int = 1
    """Processes of each instance on one port (``serve --workers``: the kernel spreads the
    connections over them, as a load balancer spreads requests over instances)."""

    @property
    def sharing(self) -> str | None:
        """How the gateways share routing state; None: they do not."""
        if self.shared:
            return "through Redis"
        return "between workers without Redis" if self.workers > 1 else None

    @property
    def label(self) -> str:
        if self.workers > 1:
            return f"1 instance, {self.workers} workers, {'Redis' if self.shared else 'no Redis'}"
        if self.instances == 1:
            return "1 instance"
        return f"{self.instances} instances, {'Redis' if self.shared else 'local (unshared)'}"


@dataclass(frozen=True, slots=True)
class Lag:
    """Dispatch on one instance to its replay on another, from their histograms."""

    count: int
    mean_s: float
    p50_s: float
    p99_s: float
    """Upper bounds of the histogram buckets holding the quantile."""


@dataclass(frozen=True, slots=True)
class Row:
    layout: Layout
    workload: str
    measurement: Measurement
    lag: Lag | None


def _lag_from(texts: Sequence[str]) -> Lag | None:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for text in texts:
        for line in text.splitlines():
            if line.startswith(f"{STATE_APPLY_LAG}_bucket"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = math.inf if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith(f"{STATE_APPLY_LAG}_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith(f"{STATE_APPLY_LAG}_count"):
                count += float(line.rsplit(" ", 1)[1])
    if count <= 0:
        return None

    def quantile(q: float) -> float:
        return next(b for b, c in sorted(buckets.items()) if c >= q * count)

    return Lag(int(count), total / count, quantile(0.5), quantile(0.99))


async def _metrics(gateways: Sequence[ManagedProcess]) -> list[str]:
    async with aiohttp.ClientSession() as session:
        texts = []
        for g in gateways:
            async with session.get(f"{g.url}/metrics") as response:
                texts.append(await response.text())
        return texts


async def run_layout(
    layout: Layout,
    workload: PlannedWorkload,
    urls: Sequence[str],
    redis_url: str | None,
    live: list[ManagedProcess],
) -> Row:
    policy = {
        "pools": {
            "bench": {
                "model": SIM_MODEL, "replicas": list(urls), "policy": PREFIX_AWARE.policy,
                **workload.gateway_pool,
            }
        }
    }  # fmt: skip
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "0", "GATEWAY_WORKERS": str(layout.workers)}
    if layout.shared and redis_url is not None:
        # A key prefix per run: nothing learned in an earlier run is shared into this one.
        prefix = f"bench-{layout.instances}x{layout.workers}-{workload.info.key}-{workload.seed}"
        env |= {"GATEWAY_REDIS_URL": redis_url, "GATEWAY_STATE_KEY_PREFIX": prefix}
    gateways = list(
        await asyncio.gather(*(start_gateway(policy, env=env) for _ in range(layout.instances)))
    )
    live += gateways
    try:
        before = await reset_and_verify(urls)
        run = await run_conversations(
            gateways[0].url,
            workload.conversations,
            model=SIM_MODEL,
            concurrency=workload.concurrency or CONCURRENCY_CAP,
            timeout_s=SIM_TIMEOUT_S,
            arrivals=workload.arrivals,
            progress=False,
            spread=[g.url for g in gateways[1:]],
        )
        lag = _lag_from(await _metrics(gateways)) if layout.sharing else None
    finally:
        await stop_all(gateways)
        for g in gateways:
            live.remove(g)
    after = await wait_quiet(urls, SIM_TIMEOUT_S)
    bound = affinity_bound_with_tools((r.messages, r.tools) for r in run.results)
    measurement = summarize(
        PREFIX_AWARE, workload.info.key, run, delta(before, after), urls, bound, seed=workload.seed
    )
    return Row(layout, workload.info.key, measurement, lag)


async def run_all(
    layouts: Sequence[Layout], workloads: Sequence[PlannedWorkload], replicas: int
) -> list[Row]:
    """Start the simulated fleet (and a Redis when a layout shares), run every layout on every
    workload (layouts interleaved per workload), stop everything."""
    live: list[ManagedProcess] = []
    rows: list[Row] = []
    try:
        fleet = await start_sim_replicas(replicas, model=SIM_MODEL)
        live += fleet
        redis_url = None
        if any(layout.shared for layout in layouts):
            redis = await start_redis()
            live.append(redis)
            redis_url = redis.url
        urls = [r.url for r in fleet]
        await warm_up(urls, SIM_MODEL)
        for workload in workloads:
            for layout in layouts:
                row = await run_layout(layout, workload, urls, redis_url, live)
                rows.append(row)
                _progress(row)
    finally:
        with contextlib.suppress(Exception):
            await stop_all(live)
    return rows


def _progress(row: Row) -> None:
    m = row.measurement
    hit = "-" if m.hit_rate is None else f"{m.hit_rate:.3f}"
    balance = "-" if m.balance is None else f"{m.balance:.2f}"
    lag = "" if row.lag is None else f"  lag mean {row.lag.mean_s * 1000:.1f} ms"
    print(
        f"  {row.workload:5} seed {m.seed} {row.layout.label:33} hit {hit}  max/mean {balance}  "
        f"errors {m.errors}/{m.sent}{lag}",
        flush=True,
    )
