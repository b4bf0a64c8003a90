"""A conversation one gateway instance sent large stays large through another instance when they
share state through Redis: its follow-up, read alone, would go small."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from bench.launcher import start_gateway
from gateway import headers
from tests.conftest import FAST_PROBES, running_sims
from tests.redis_server import running_redis
from tests.tiers import EASY_FOLLOW_UP as EASY
from tests.tiers import HARD, OPENING, dialogue, tiered_policy


async def tier_of(url: str, body: dict[str, Any]) -> str:
    """The pool a tiered request went to through the gateway at ``url``."""
    payload = orjson.dumps({"model": "auto", "max_tokens": 4, **body})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", data=payload) as response,
    ):
        assert response.status == 200, await response.text()
        return response.headers[headers.POOL]


async def test_a_follow_up_through_another_instance_keeps_the_conversations_large_tier() -> None:
    async with (
        running_redis() as redis,
        running_sims(1, "small-model") as [small],
        running_sims(1, "large-model") as [large],
    ):
        policy = tiered_policy({"small": small, "large": large})
        shared = {**FAST_PROBES, "GATEWAY_REDIS_URL": redis.url}
        first, second, alone = await asyncio.gather(
            start_gateway(policy, env=shared),
            start_gateway(policy, env=shared),
            start_gateway(policy, env=FAST_PROBES),
        )
        try:
            assert await tier_of(first.url, dialogue(OPENING)) == "small"
            assert await tier_of(first.url, dialogue(OPENING, HARD)) == "large"
            follow_up = dialogue(OPENING, HARD, EASY)  # read alone: the opening and a thank-you
            assert await tier_of(alone.url, follow_up) == "small"  # an instance not sharing
            assert await tier_of(second.url, follow_up) == "large"
        finally:
            await asyncio.gather(first.stop(), second.stop(), alone.stop())
