"""A conversation one gateway instance sent large stays large through another instance when they
share state through Redis: its follow-up, read alone, would go small; the other instance's dry
run (POST /admin/route) says so too. The shared memory is asked about follow-ups only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from bench.launcher import start_gateway
from gateway import headers
from gateway.routing.affinity import LargeConversations
from router_policies.tier_memory import conversation_keys
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings
from tests.conftest import FAST_PROBES, admin_route, eventually
from tests.redis_server import running_redis
from tests.tiers import EASY_FOLLOW_UP as EASY
from tests.tiers import HARD, OPENING, dialogue, small_and_large, tiered_policy


async def tier_of(url: str, body: dict[str, Any]) -> str:
    """The pool a tiered request went to through the gateway at ``url``."""
    payload = orjson.dumps({"model": "auto", "max_tokens": 4, **body})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", data=payload) as response,
    ):
        assert response.status == 200, await response.text()
        return response.headers[headers.POOL]


@contextlib.asynccontextmanager
async def redis_and_tiers() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A Redis's URL, and a tier policy over one small and one large simulated replica."""
    async with running_redis() as redis, small_and_large() as pools:
        yield redis.url, tiered_policy(pools)


async def test_a_follow_up_through_another_instance_keeps_the_conversations_large_tier() -> None:
    async with redis_and_tiers() as (redis_url, policy):
        shared = {**FAST_PROBES, "GATEWAY_REDIS_URL": redis_url}
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


async def test_a_dry_run_through_another_instance_reads_the_shared_memory_too() -> None:
    async with redis_and_tiers() as (redis_url, policy):
        shared = {**FAST_PROBES, "GATEWAY_REDIS_URL": redis_url, "GATEWAY_ADMIN_TOKEN": "admin"}
        first, second = await asyncio.gather(
            start_gateway(policy, env=shared), start_gateway(policy, env=shared)
        )
        try:
            assert await tier_of(first.url, dialogue(OPENING, HARD)) == "large"
            follow_up = {"model": "auto", **dialogue(OPENING, HARD, EASY)}

            async def kept_large() -> bool:  # once the first's write has reached Redis
                dry_run = await admin_route(second.url, "admin", follow_up)
                return (
                    dry_run["pool"] == "large" and dry_run["tier"]["kept_by_conversation"] is True
                )

            assert await eventually(kept_large)
            assert await tier_of(second.url, follow_up) == "large"  # as the real one goes
        finally:
            await asyncio.gather(first.stop(), second.stop())


async def test_the_shared_memory_is_asked_only_for_a_follow_up_under_each_of_its_keys() -> None:
    asked: list[tuple[str, tuple[int, ...]]] = []

    async def went_large_elsewhere(model: str, keys: tuple[int, ...]) -> bool:
        asked.append((model, keys))
        return True

    shared = LargeConversations()
    shared.fetch = went_large_elsewhere
    tiers = TierRouter("auto", TierSettings(small="small", large="large"))
    await shared.recall(tiers, dialogue(OPENING))
    assert asked == [] and not tiers.classify(dialogue(OPENING)).kept
    follow = dialogue(OPENING, HARD, EASY)
    await shared.recall(tiers, follow)
    assert asked == [("auto", conversation_keys(follow))]
    assert tiers.classify(follow).kept
