"""A request's priority class (x-gateway-priority): when every replica of a pool is full, the
highest priority leaves the gateway's queue first, and a sheddable request (below 0) is
refused at once with a 429 that says when to retry, instead of waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from gateway.fleet.pool_queue import PoolQueue
from tests.conftest import chat, running_gateway, running_sims

SLOW: dict[str, Any] = {"decode_step_s": 0.05}
"""A replica taking about a second for a 20-token answer: long enough to fill its one slot."""


async def test_the_queue_wakes_the_highest_priority_first_then_in_arrival_order() -> None:
    queue = PoolQueue()
    woken: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        await queue.wait(5.0, priority)
        woken.append(name)

    tasks = []
    for name, priority in (("first", 0), ("urgent", 5), ("second", 0)):
        tasks.append(asyncio.create_task(waiter(name, priority)))
        await asyncio.sleep(0)
    assert queue.ahead_of(5) and queue.ahead_of(0) and not queue.ahead_of(6)
    for _ in tasks:
        queue.wake_one()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert woken == ["urgent", "first", "second"]


async def test_a_full_pool_serves_the_higher_priority_first_and_sheds_the_sheddable() -> None:
    async with (
        running_sims(1, **SLOW) as sims,
        running_gateway([sims[0].url], max_inflight_per_replica=1, queue_timeout_s=20) as gw,
    ):
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        ended: list[str] = []

        async def ask(name: str, priority: int) -> None:
            await client.chat.completions.create(
                **chat("You answer slowly.", name, max_tokens=20),
                extra_headers={"x-gateway-priority": str(priority)},
            )
            ended.append(name)

        busy = asyncio.create_task(ask("busy", 0))
        await asyncio.sleep(0.3)  # the replica's one slot is taken
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as shed:
            await ask("sheddable", -1)
        assert time.monotonic() - started < 0.5  # refused at once, not after a wait
        assert shed.value.response.headers["retry-after"] == "1"
        assert shed.value.response.headers["retry-after-ms"] == "1000"
        assert shed.value.code == "pool_saturated"
        normal = asyncio.create_task(ask("normal", 0))
        await asyncio.sleep(0.2)
        urgent = asyncio.create_task(ask("urgent", 3))
        await asyncio.gather(busy, normal, urgent)
        assert ended == ["busy", "urgent", "normal"]


async def test_a_malformed_priority_is_the_clients_error() -> None:
    async with running_sims(1) as sims, running_gateway([sims[0].url]) as gw:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        for value in ("high", "2.5", "100000"):
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(
                    **chat("s", "u"), extra_headers={"x-gateway-priority": value}
                )
            assert bad.value.param == "x-gateway-priority"
