"""What sharing costs in CPU: two gateway instances on the local backend (sharing nothing)
against two sharing through Redis and one instance of two workers sharing with each other (no
Redis); the same streaming traffic split over the two processes of each layout (the kernel
splits it between the workers), batches interleaved; CPU time per request summed over the
layout's processes (/proc schedstat; the workers' parent counts its children)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bench.compare.runner import stop_all
from bench.driver import run_plain
from bench.host import process_cpu_s
from bench.launcher import start_gateway
from bench.overhead.config import MODEL, ZERO_DELAY
from bench.overhead.runner import round_order
from bench.redis_server import start_redis
from replica.processes import ManagedProcess, start_sim_replicas

BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello there " * 20}],
    "max_tokens": 16,
}
LAYOUTS = ("local", "redis", "workers")


def _cpu(processes: Sequence[ManagedProcess]) -> float:
    return sum(process_cpu_s(p.pid) or 0.0 for p in processes)


async def sharing_cpu(
    rounds: int = 9, per_instance: int = 300, concurrency: int = 16
) -> dict[str, float]:
    """Microseconds of gateway CPU per request, by layout (LAYOUTS)."""
    live: list[ManagedProcess] = []
    try:
        [replica] = await start_sim_replicas(1, model=MODEL, **ZERO_DELAY)
        live.append(replica)
        redis = await start_redis()
        live.append(redis)
        policy = {"pools": {"bench": {"model": MODEL, "replicas": [replica.url]}}}
        envs = {"local": {}, "redis": {"GATEWAY_REDIS_URL": redis.url}}
        pairs = {
            name: [await start_gateway(policy, env=envs[name]) for _ in range(2)] for name in envs
        }
        workers = await start_gateway(policy, env={"GATEWAY_WORKERS": "2"})
        pairs["workers"] = [workers]
        for pair in pairs.values():
            live += pair
        # Two clients per layout: one to each instance, or both to the workers' port.
        urls = {name: [pair[i % len(pair)].url for i in range(2)] for name, pair in pairs.items()}
        cpu = dict.fromkeys(LAYOUTS, 0.0)
        sent = dict.fromkeys(LAYOUTS, 0)
        for index in range(rounds):
            for name in round_order(LAYOUTS, index):
                pair = pairs[name]
                before = _cpu(pair)
                runs = await asyncio.gather(
                    *(
                        run_plain(url, BODY, requests=per_instance, concurrency=concurrency,
                                  stream=True)
                        for url in urls[name]
                    )
                )  # fmt: skip
                cpu[name] += _cpu(pair) - before
                sent[name] += sum(len(r.results) for r in runs)
        return {name: cpu[name] / sent[name] * 1e6 for name in LAYOUTS}
    finally:
        await stop_all(live)
