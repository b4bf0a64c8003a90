"""What a leasing instance holds of a tenant's rate: one lease at most, whatever comes back as
refunds, and nothing once it has stopped. On a real redis-server, the leases on a fake clock;
what Redis counts as used is read from the bucket itself."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry, Counter

from gateway.rate_limit.leases import LeasedStore
from gateway.rate_limit.redis_store import RedisStore
from router_policies.rate_limit import Limit
from tests.redis_server import RedisServer, running_redis

TOKENS = Limit(1200)  # 20 a second: the few milliseconds a step takes refill well under 1
LEASE_S = 5.0  # leases of 100 tokens


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    async with running_redis() as running:
        yield running


def _leased(server: RedisServer, clock: _Clock, timeout_s: float = 0.5) -> LeasedStore:
    errors = Counter("errors", "", registry=CollectorRegistry())
    return LeasedStore(RedisStore(server.url, errors, timeout_s=timeout_s), LEASE_S, clock)


async def _used_in_redis(server: RedisServer, key: str) -> float:
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        used = await client.hget(f"llm-gateway:ratelimit:{key}", "used")
    finally:
        await client.aclose()
    return float(used) if used is not None else 0.0


async def test_a_refund_fills_the_lease_to_one_lease_and_the_rest_goes_back_to_redis(
    server: RedisServer,
) -> None:
    store = _leased(server, _Clock())
    try:
        assert (await store.take(["{t}:tokens"], [TOKENS], [40])).allowed  # type: ignore[union-attr]
        assert await _used_in_redis(server, "{t}:tokens") == pytest.approx(140, abs=1)
        await store.adjust("{t}:tokens", TOKENS, -40)  # used nothing: all 40 back
        # The lease already holds its 100: the refund is the tenant's again, in Redis.
        assert await _used_in_redis(server, "{t}:tokens") == pytest.approx(100, abs=1)
    finally:
        await store.close()


async def test_a_refund_that_fits_stays_in_the_lease(server: RedisServer) -> None:
    store = _leased(server, _Clock())
    try:
        await store.take(["{t}:tokens"], [TOKENS], [40])
        await store.take(["{t}:tokens"], [TOKENS], [30])  # from the lease: 70 left
        assert store.adjust_now("{t}:tokens", TOKENS, -30)  # back to 100: no call
        assert await _used_in_redis(server, "{t}:tokens") == pytest.approx(140, abs=1)
    finally:
        await store.close()


async def test_a_refund_reaching_an_expired_lease_goes_back_to_redis(server: RedisServer) -> None:
    clock = _Clock()
    store = _leased(server, clock)
    try:
        await store.take(["{t}:tokens"], [TOKENS], [40])
        await store.take(["{t}:tokens"], [TOKENS], [30])  # from the lease: 70 left
        clock.now += LEASE_S  # expired: held until this instance's next call, whenever
        await store.adjust("{t}:tokens", TOKENS, -30)
        assert await _used_in_redis(server, "{t}:tokens") == pytest.approx(110, abs=1)
    finally:
        await store.close()


async def test_a_stopped_instance_gives_every_lease_back(server: RedisServer) -> None:
    clock = _Clock()
    store = _leased(server, clock)
    await store.take(["{a}:tokens"], [TOKENS], [40])
    await store.take(["{a}:tokens"], [TOKENS], [30])  # 70 left
    clock.now += LEASE_S  # expired leases hold their tokens too
    await store.take(["{b}:tokens"], [TOKENS], [10])  # 100 left
    await store.close()
    assert await _used_in_redis(server, "{a}:tokens") == pytest.approx(70, abs=1)
    assert await _used_in_redis(server, "{b}:tokens") == pytest.approx(10, abs=1)


async def test_a_stop_with_redis_silent_gives_up_on_the_leases_within_its_timeout(
    server: RedisServer,
) -> None:
    store = _leased(server, _Clock(), timeout_s=0.2)
    for tenant in range(10):
        await store.take([f"{{t{tenant}}}:tokens"], [TOKENS], [1])
    os.kill(server.pid, signal.SIGSTOP)  # alive, connected, silent
    try:
        # A hang guard, not a measurement: each give-back fails open after 0.2 s, the first
        # failure skips the rest, and all of them stop after twice the timeout.
        await asyncio.wait_for(store.close(), timeout=10)
    finally:
        os.kill(server.pid, signal.SIGCONT)
