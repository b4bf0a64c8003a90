"""Redis SIGKILLed in the middle of a run: failed requests, and the hit rate by phase (before,
during the outage, the first 10 s after Redis returns, then), set against one instance on the
same workload. Per-request hit rates come from the usage each replica reports
(cached_tokens / prompt_tokens), each request placed in a phase by its arrival time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bench.compare.plan import SIM_MODEL, planned
from bench.compare.runner import CONCURRENCY_CAP, SIM_TIMEOUT_S, stop_all, warm_up
from bench.driver import RunResult, run_conversations
from bench.launcher import start_gateway
from bench.redis_server import RedisProcess, start_redis
from bench.replica_counters import reset_and_verify, wait_quiet
from bench.workloads import generated_shared_prefix
from replica.processes import ManagedProcess, start_sim_replicas

KILL_AT_S = 8.0
DOWN_S = 8.0
SETTLE_S = 10.0
"""The acceptance window: the hit rate is judged from this long after Redis returns."""
RATE = 16.0


@dataclass(frozen=True, slots=True)
class Phases:
    failed: int
    sent: int
    hit_rates: tuple[tuple[str, float | None], ...]


def _phase_names() -> list[tuple[str, float, float]]:
    back = KILL_AT_S + DOWN_S
    return [
        ("before the kill", 0.0, KILL_AT_S),
        ("Redis down", KILL_AT_S, back),
        (f"first {SETTLE_S:g} s after its return", back, back + SETTLE_S),
        (f"from {SETTLE_S:g} s after its return", back + SETTLE_S, float("inf")),
    ]


def _phases(run: RunResult, starts: dict[str, float]) -> Phases:
    rates = []
    for name, lo, hi in _phase_names():
        chosen = [r for r in run.results if r.ok and lo <= starts.get(r.conversation, -1.0) < hi]
        prompt = sum(r.prompt_tokens for r in chosen)
        rates.append((name, sum(r.cached_tokens for r in chosen) / prompt if prompt else None))
    failed = sum(1 for r in run.results if not r.ok)
    return Phases(failed, run.sent, tuple(rates))


async def _outage(redis: RedisProcess, holder: list[RedisProcess]) -> None:
    await asyncio.sleep(KILL_AT_S)
    await redis.kill()
    await asyncio.sleep(DOWN_S)
    back = RedisProcess(redis.argv[0], redis.port)
    await back.start()
    holder.append(back)


async def run_outage(replicas: int, prompts_per_group: int = 40) -> tuple[Phases, Phases]:
    """(one instance, two instances sharing through a Redis killed mid-run)."""
    conversations = generated_shared_prefix(16, prompts_per_group, 2048, 128, 32, 0)
    workload = planned("gsp", "gsp", "", "", conversations, RATE, 0)
    assert workload.arrivals is not None
    starts = {c.id: at for c, at in zip(conversations, workload.arrivals, strict=True)}
    live: list[ManagedProcess] = []
    results = []
    try:
        fleet = await start_sim_replicas(replicas, model=SIM_MODEL)
        live += fleet
        urls = [r.url for r in fleet]
        await warm_up(urls, SIM_MODEL)
        policy = {"pools": {"bench": {"model": SIM_MODEL, "replicas": urls}}}
        for instances in (1, 2):
            env = {"GATEWAY_SHUTDOWN_DELAY_S": "0"}
            redis: RedisProcess | None = None
            if instances > 1:
                redis = await start_redis()
                live.append(redis)
                env["GATEWAY_REDIS_URL"] = redis.url
            gateways = list(
                await asyncio.gather(*(start_gateway(policy, env=env) for _ in range(instances)))
            )
            live += gateways
            await reset_and_verify(urls)
            revived: list[RedisProcess] = []
            chaos = asyncio.create_task(_outage(redis, revived)) if redis else None
            run = await run_conversations(
                gateways[0].url,
                workload.conversations,
                model=SIM_MODEL,
                concurrency=CONCURRENCY_CAP,
                timeout_s=SIM_TIMEOUT_S,
                arrivals=workload.arrivals,
                progress=False,
                spread=[g.url for g in gateways[1:]],
            )
            if chaos is not None:
                await chaos
            await stop_all([*gateways, *revived])
            for p in gateways:
                live.remove(p)
            await wait_quiet(urls, SIM_TIMEOUT_S)
            results.append(_phases(run, starts))
    finally:
        await stop_all(live)
    return results[0], results[1]


def outage_markdown(one: Phases, two: Phases, command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"gsp, 16 groups, Poisson {RATE:g} req/s; with 2 instances Redis is SIGKILLed at "
        f"{KILL_AT_S:g} s and a new one started on its port {DOWN_S:g} s later.",
        "",
        "| phase (by arrival) | 1 instance hit rate | 2 instances hit rate | ratio |",
        "|---|---|---|---|",
    ]
    for (name, a), (_, b) in zip(one.hit_rates, two.hit_rates, strict=True):
        ratio = f"{b / a:.3f}x" if a and b is not None else "-"
        fa = "-" if a is None else f"{a:.3f}"
        fb = "-" if b is None else f"{b:.3f}"
        lines.append(f"| {name} | {fa} | {fb} | {ratio} |")
    lines += [
        "",
        f"Failed requests: 1 instance {one.failed}/{one.sent}, "
        f"2 instances {two.failed}/{two.sent}.",
    ]
    return "\n".join(lines) + "\n"
