"""Where requests land, seen from outside: the x-gateway-replica and x-gateway-route headers."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio

from gateway import headers
from tests.conftest import GatewayClient, chat, in_process_gateway, in_process_sims, pool_policy

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas() -> AsyncIterator[list[str]]:
    # Slow enough decoding that concurrent requests really overlap in flight.
    async with in_process_sims(3, decode_step_s=0.02) as urls:
        yield urls


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(replicas: list[str]) -> AsyncIterator[GatewayClient]:
    async with in_process_gateway(pool_policy(replicas)) as client:
        yield client


async def send(client: GatewayClient, body: dict[str, Any]) -> tuple[str, str]:
    async with client.post("/v1/chat/completions", data=orjson.dumps(body)) as response:
        assert response.status == 200, await response.text()
        await response.read()
        return response.headers[headers.REPLICA], response.headers[headers.ROUTE]


async def test_requests_sharing_a_system_prompt_stick_to_one_replica(
    gateway: GatewayClient,
) -> None:
    system = "You answer questions about the Acme API. " * 40
    landed = [await send(gateway, chat(system, f"question {i}")) for i in range(8)]
    replicas = {replica for replica, _ in landed}
    routes = [route for _, route in landed]
    assert len(replicas) == 1
    assert routes[0] == "prefix-home"
    assert set(routes[1:]) == {"prefix-hit"}


async def test_distinct_system_prompts_spread_over_the_replicas(
    gateway: GatewayClient, replicas: list[str]
) -> None:
    landed = [await send(gateway, chat(f"Persona number {i}. " * 40, "hello")) for i in range(24)]
    per_replica = Counter(replica for replica, _ in landed)
    assert set(per_replica) == {url.removeprefix("http://") for url in replicas}
    assert max(per_replica.values()) <= 16  # 24 homes over 3 replicas, not a pile-up
    assert {route for _, route in landed} == {"prefix-home"}


async def test_a_burst_of_cache_hits_stays_home(gateway: GatewayClient) -> None:
    """Nine requests decoding together on the replica that holds their prefix cost one slower
    engine step each; a cold replica would cost each a whole prefill. The burst stays home."""
    system = "A very popular shared system prompt. " * 40
    home, _ = await send(gateway, chat(system, "warm-up", max_tokens=1))
    burst = [chat(system, f"burst {i}", max_tokens=40) for i in range(9)]
    landed = await asyncio.gather(*(send(gateway, b) for b in burst))
    assert {replica for replica, _ in landed} == {home}
    assert {route for _, route in landed} == {"prefix-hit"}


@pytest.mark.parametrize("policy", ["round-robin", "least-loaded"])
async def test_baseline_policies_route_and_say_so(replicas: list[str], policy: str) -> None:
    async with in_process_gateway(pool_policy(replicas, policy)) as gw:
        landed = [await send(gw, chat("same system prompt " * 30, f"q{i}")) for i in range(6)]
    assert {route for _, route in landed} == {policy}
    assert len({replica for replica, _ in landed}) == 3 if policy == "round-robin" else True
