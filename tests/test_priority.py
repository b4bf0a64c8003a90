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
from gateway.fleet.pools import Dispatch, Fleet, PoolState
from router_policies.fingerprint import load_only
from router_policies.schema import parse_policy
from tests.conftest import chat, running_gateway, running_sims

SLOW: dict[str, Any] = {"decode_step_s": 0.05}
"""A replica taking about a second for a 20-token answer: long enough to fill its one slot."""


async def test_the_queue_wakes_the_highest_priority_first_then_in_arrival_order() -> None:
    queue = PoolQueue()
    woken: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        ticket = queue.join(priority)
        assert await queue.wait(ticket, 5.0)
        woken.append(name)
        queue.leave(ticket, pass_on=False)

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


async def test_requests_waiting_through_rechecks_are_served_in_arrival_order() -> None:
    # Each waiter rechecks the pool every quarter second: a recheck must not send it to the
    # back of the line, nor let a later arrival take a slot freed for an earlier one.
    pool = Fleet(
        parse_policy({"pools": {"p": {"model": "m", "replicas": ["http://127.0.0.1:9101"],
                                      "max_inflight_per_replica": 1, "queue_timeout_s": 10}}})
    ).pools["p"]  # fmt: skip
    first = pool.decide(load_only("m"))
    assert first is not None
    dispatch = pool.begin(first, load_only("m"))
    served: asyncio.Queue[tuple[int, Dispatch]] = asyncio.Queue()

    async def wait_for_a_slot(i: int) -> None:
        got = await pool.acquire(load_only("m"))
        assert got is not None
        served.put_nowait((i, got))

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(wait_for_a_slot(i)))
        await asyncio.sleep(0.1)
    order = []
    for _ in tasks:
        pool.end(dispatch)
        i, dispatch = await asyncio.wait_for(served.get(), 1.0)
        order.append(i)
    assert order == list(range(6))


def full_pool(*replicas: str) -> tuple[PoolState, list[Dispatch]]:
    """A pool whose replicas take one request each, every one of them taken."""
    policy = {"model": "m", "replicas": list(replicas), "max_inflight_per_replica": 1,
              "queue_timeout_s": 10}  # fmt: skip
    pool = Fleet(parse_policy({"pools": {"p": policy}})).pools["p"]
    running = []
    for _ in replicas:
        decision = pool.decide(load_only("m"))
        assert decision is not None
        running.append(pool.begin(decision, load_only("m")))
    return pool, running


async def test_a_slot_the_first_in_line_cannot_take_goes_to_the_next() -> None:
    pool, (on_a, _) = full_pool("http://127.0.0.1:9101", "http://127.0.0.1:9102")
    # A retry, kept off the replica its first attempt failed on, waits first.
    retry = asyncio.create_task(pool.acquire(load_only("m"), exclude=[on_a.replica.name]))
    await asyncio.sleep(0.01)
    behind = asyncio.create_task(pool.acquire(load_only("m")))
    await asyncio.sleep(0.01)
    pool.end(on_a)
    got = await asyncio.wait_for(behind, 2.0)  # at once, not at the retry's queue timeout (10 s)
    assert got is not None and got.replica is on_a.replica
    assert not retry.done()
    retry.cancel()


async def test_a_request_cancelled_as_it_is_offered_a_slot_passes_it_on() -> None:
    pool, (running,) = full_pool("http://127.0.0.1:9101")
    first = asyncio.create_task(pool.acquire(load_only("m")))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(pool.acquire(load_only("m")))
    await asyncio.sleep(0.01)
    pool.end(running)  # the slot is offered to the first...
    first.cancel()  # ...whose client leaves before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    got = await asyncio.wait_for(second, 2.0)
    assert got is not None


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


async def test_a_request_that_waited_its_queue_timeout_is_told_when_to_come_back() -> None:
    async with (
        running_sims(1, **SLOW) as sims,
        running_gateway([sims[0].url], max_inflight_per_replica=1, queue_timeout_s=0.3) as gw,
    ):
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        busy = asyncio.create_task(
            client.chat.completions.create(**chat("You answer slowly.", "busy", max_tokens=20))
        )
        await asyncio.sleep(0.3)  # the replica's one slot is taken for ~1 s
        with pytest.raises(openai.InternalServerError) as waited:
            await client.chat.completions.create(**chat("s", "waits"))
        assert waited.value.status_code == 503
        assert waited.value.code == "pool_saturated"
        assert waited.value.response.headers["retry-after"] == "1"
        assert waited.value.response.headers["retry-after-ms"] == "1000"
        await busy


async def test_a_malformed_priority_is_the_clients_error() -> None:
    async with running_sims(1) as sims, running_gateway([sims[0].url]) as gw:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        for value in ("high", "2.5", "100000"):
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(
                    **chat("s", "u"), extra_headers={"x-gateway-priority": value}
                )
            assert bad.value.param == "x-gateway-priority"
