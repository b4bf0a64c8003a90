"""Acceptance: one limit across several gateway instances. Two real `llm-gateway serve`
processes share their buckets through one real redis-server: with a limit of N requests per
minute and 4 x N requests sent at once through both, N are served (+-1) and the rest get
OpenAI's 429 with its headers."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from openai import AsyncOpenAI

from bench.launcher import start_gateway
from gateway import headers
from gateway.rate_limit import hash_key
from replica.processes import start_all
from tests.conftest import FAST_PROBES, MODEL, pool_policy, running_sims
from tests.redis_server import running_redis

N = 10
KEY = "sk-acceptance-tenant"


async def _send(client: AsyncOpenAI) -> tuple[int, Any]:
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
    except openai.RateLimitError as exc:
        return 429, exc.response.headers
    return raw.http_response.status_code, raw.headers


async def test_n_per_minute_across_two_instances_on_one_redis() -> None:
    async with running_redis() as redis, running_sims(2, decode_step_s=0.001) as replicas:
        policy = {
            **pool_policy([r.url for r in replicas]),
            "limits": {
                "tenants": {
                    "acme": {
                        "api_key_sha256": [hash_key(KEY)],
                        "requests_per_minute": N,
                        "tokens_per_minute": 1_000_000,  # far off: its headers ride along
                    }
                }
            },
        }
        env = {**FAST_PROBES, "GATEWAY_REDIS_URL": redis.url}
        gateways = await start_all(start_gateway(policy, env=env) for _ in range(2))
        clients = [
            AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0, timeout=30)
            for gw in gateways
        ]
        try:
            answers = await asyncio.gather(*(_send(clients[i % 2]) for i in range(4 * N)))
        finally:
            for client in clients:
                await client.close()
            await asyncio.gather(*(gw.stop() for gw in gateways))

    served = [h for status, h in answers if status == 200]
    limited = [h for status, h in answers if status == 429]
    split = [
        sum(1 for i, (status, _) in enumerate(answers) if status == 200 and i % 2 == g)
        for g in (0, 1)
    ]
    # Each instance alone would serve N (2N in all): N in all means one shared set of buckets.
    assert N - 1 <= len(served) <= N + 1, f"served {len(served)} (per instance: {split})"
    assert len(served) + len(limited) == 4 * N  # nothing else: no 5xx, no fail-open
    for sent in limited:
        assert int(sent[headers.RETRY_AFTER]) >= 1
        assert sent[headers.RATELIMIT_LIMIT_REQUESTS] == str(N)
        assert sent[headers.RATELIMIT_REMAINING_REQUESTS] == "0"
        assert sent[headers.RATELIMIT_RESET_REQUESTS]
        assert sent[headers.RATELIMIT_LIMIT_TOKENS] == "1000000"
        assert int(sent[headers.RATELIMIT_REMAINING_TOKENS]) > 990_000
        assert sent[headers.RATELIMIT_RESET_TOKENS]
    # Every admission saw the one shared count go down: N-1, ..., 0, across both instances.
    remaining = sorted(int(h[headers.RATELIMIT_REMAINING_REQUESTS]) for h in served)
    assert remaining == list(range(len(served)))
