"""Where requests land, seen from outside: the x-gateway-replica and x-gateway-route headers."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from gateway import headers
from replica.processes import ManagedProcess
from tests.conftest import chat, running_gateway, running_sims

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas() -> AsyncIterator[list[ManagedProcess]]:
    # Slow enough decoding that concurrent requests really overlap in flight.
    async with running_sims(3, decode_step_s=0.02) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(replicas: list[ManagedProcess]) -> AsyncIterator[ManagedProcess]:
    async with running_gateway([r.url for r in replicas]) as gw:
        yield gw


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    async with session.post(f"{url}/v1/chat/completions", data=orjson.dumps(body)) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers[headers.REPLICA], response.headers[headers.ROUTE]


async def test_requests_sharing_a_system_prompt_stick_to_one_replica(
    gateway: ManagedProcess,
) -> None:
    system = "You answer questions about the Acme API. " * 40
    async with aiohttp.ClientSession() as session:
        landed = [await send(session, gateway.url, chat(system, f"question {i}")) for i in range(8)]
    replicas = {replica for replica, _ in landed}
    routes = [route for _, route in landed]
    assert len(replicas) == 1
    assert routes[0] == "prefix-home"
    assert set(routes[1:]) == {"prefix-hit"}


async def test_distinct_system_prompts_spread_over_the_replicas(
    gateway: ManagedProcess, replicas: list[ManagedProcess]
) -> None:
    async with aiohttp.ClientSession() as session:
        landed = [
            await send(session, gateway.url, chat(f"Persona number {i}. " * 40, "hello"))
            for i in range(24)
        ]
    per_replica = Counter(replica for replica, _ in landed)
    assert set(per_replica) == {r.url.removeprefix("http://") for r in replicas}
    assert max(per_replica.values()) <= 16  # 24 homes over 3 replicas, not a pile-up
    assert {route for _, route in landed} == {"prefix-home"}


async def test_a_replica_at_the_load_cap_stops_receiving_pinned_work(
    gateway: ManagedProcess,
) -> None:
    system = "A very popular shared system prompt. " * 40
    async with aiohttp.ClientSession() as session:
        # Warm the prefix on its home, then fire a burst that all shares it.
        home, _ = await send(session, gateway.url, chat(system, "warm-up", max_tokens=1))
        burst = [chat(system, f"burst {i}", max_tokens=40) for i in range(9)]
        landed = await asyncio.gather(*(send(session, gateway.url, b) for b in burst))
    per_replica = Counter(replica for replica, _ in landed)
    routes = Counter(route for _, route in landed)
    # The cap is (1 + 0.25) x mean + 1: with 9 requests in flight on 3 replicas no replica
    # may hold more than 5 of them, so the home must have shed part of the burst.
    assert per_replica[home] <= 5
    assert len(per_replica) >= 2
    assert routes["least-loaded"] >= 1
    assert routes["prefix-hit"] >= 1


@pytest.mark.parametrize("policy", ["round-robin", "least-loaded"])
async def test_baseline_policies_route_and_say_so(
    replicas: list[ManagedProcess], policy: str
) -> None:
    async with (
        running_gateway([r.url for r in replicas], policy=policy) as gw,
        aiohttp.ClientSession() as session,
    ):
        landed = [
            await send(session, gw.url, chat("same system prompt " * 30, f"q{i}")) for i in range(6)
        ]
    assert {route for _, route in landed} == {policy}
    assert len({replica for replica, _ in landed}) == 3 if policy == "round-robin" else True
