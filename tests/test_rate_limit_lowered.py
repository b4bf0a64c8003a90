"""A limit lowered by a reload keeps its debt while callers still ask with the old, larger size:
an instance that has not reloaded yet (instances reload seconds apart), or a request admitted
before the reload and settled after it. On both stores: the in-process one on a fake clock,
the Redis one on a real redis-server (its clock: the test waits)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry, Counter

from gateway.rate_limit.redis_store import RedisStore
from gateway.rate_limit.store import BucketStore, LocalStore
from router_policies.rate_limit import Limit
from tests.redis_server import running_redis

Advance = Callable[[float], Awaitable[None]]
OLD, LOWERED = Limit(6000), Limit(60)  # 100 and 1 a second
KEY = "{t}:requests"


@pytest.fixture(params=["local", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[tuple[BucketStore, Advance]]:
    """A store and a way to let time pass on its clock."""
    if request.param == "local":
        now = [1000.0]

        async def advance(seconds: float) -> None:
            now[0] += seconds

        yield LocalStore(clock=lambda: now[0]), advance
        return
    async with running_redis() as server:
        shared = RedisStore(server.url, Counter("errors", "", registry=CollectorRegistry()))
        yield shared, asyncio.sleep
        await shared.close()


async def _spend_then_lower(store: BucketStore) -> float:
    """The whole old burst used, then a request under the lowered limit: refused, the used
    6000 kept as one bucket of debt (120). Returns the wait it announces."""
    assert (spent := await store.take([KEY], [OLD], [6000])) and spent.allowed
    refused = await store.take([KEY], [LOWERED], [1])
    assert refused is not None and not refused.allowed
    return refused.retry_after_s


async def test_an_instance_not_yet_reloaded_does_not_refill_the_lowered_limits_debt(
    store: tuple[BucketStore, Advance],
) -> None:
    buckets, advance = store
    await _spend_then_lower(buckets)
    for _ in range(2):  # the other instance, still on the old limit, serves two requests
        await advance(0.5)
        served = await buckets.take([KEY], [OLD], [1])
        assert served is not None and served.allowed  # it enforces the limit it has
    refused = await buckets.take([KEY], [LOWERED], [1])
    # 120 owed, 1 refilled at the lowered rate, 2 more used: 121 of 60, the next one needs
    # 62 s. At the old rate the second instance would have refilled 100, the wait 12 s.
    assert refused is not None and not refused.allowed
    assert 60 < refused.retry_after_s <= 62


async def test_a_request_settled_after_the_reload_does_not_refill_the_lowered_limits_debt(
    store: tuple[BucketStore, Advance],
) -> None:
    buckets, advance = store
    await _spend_then_lower(buckets)
    await advance(0.5)
    # Admitted before the reload, its usage correction carries the old limit.
    await buckets.adjust(KEY, OLD, -1)
    refused = await buckets.take([KEY], [LOWERED], [1])
    assert refused is not None and not refused.allowed
    assert 59 < refused.retry_after_s <= 61  # 120 - 0.5 - 1 owed: (119.5 - 60 + 1) s


async def test_a_limit_raised_once_the_bucket_is_full_refills_at_the_raised_rate(
    store: tuple[BucketStore, Advance],
) -> None:
    buckets, advance = store
    small, raised = Limit(600), Limit(60_000)  # 10 and 1,000 a second
    assert (first := await buckets.take([KEY], [small], [1])) and first.allowed
    await advance(0.2)  # full again at the small rate (0.1 s)
    assert (burst := await buckets.take([KEY], [raised], [60_000])) and burst.allowed
    await advance(0.2)  # 200 back at the raised rate; 2 at the small one
    refilled = await buckets.take([KEY], [raised], [100])
    assert refilled is not None and refilled.allowed


async def test_in_redis_the_old_limits_request_leaves_the_bucket_as_long_as_the_lowered_wait() -> (
    None
):
    async with running_redis() as server:
        buckets = RedisStore(server.url, Counter("errors", "", registry=CollectorRegistry()))
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            wait_s = await _spend_then_lower(buckets)
            assert (served := await buckets.take([KEY], [OLD], [1])) and served.allowed
            # Expired by the old size (about 2 s) the bucket would be full at once: a whole
            # new bucket under the lowered limit.
            ttl_ms = await client.pttl(f"llm-gateway:ratelimit:{KEY}")
            assert ttl_ms >= wait_s * 1000
        finally:
            await client.aclose()
            await buckets.close()
