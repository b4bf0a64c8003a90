"""The two bucket stores keep the same rules: one table of cases runs on the in-process store
and on the Redis one (its Lua script, on a real redis-server). Then what Redis adds: several
clients share the buckets, and an outage fails open."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry, Counter

from gateway.rate_limit.leases import LeasedStore
from gateway.rate_limit.redis_store import RedisStore
from gateway.rate_limit.store import BucketStore, LocalStore
from router_policies.rate_limit import Limit
from tests.redis_server import running_redis, script_calls

# (sizes per minute, [(costs, admitted, floor of what remains in each bucket after)])
# Redis runs on the server's clock: the few milliseconds a case takes refill a small fraction
# of one unit, which no floor below sees.
Step = tuple[list[float], bool, list[int]]
CASES: dict[str, tuple[list[float], list[Step]]] = {
    "a burst of the size, then refusals": (
        [3],
        [([1], True, [2]), ([1], True, [1]), ([1], True, [0]), ([1], False, [0])],
    ),
    "all or nothing across requests and tokens": (
        [3, 100],
        [([1, 60], True, [2, 40]), ([1, 60], False, [2, 40]), ([1, 40], True, [1, 0])],
    ),
    "a cost above the size: from a full bucket only, into debt": (
        [100],
        [([250], True, [0]), ([1], False, [0])],
    ),
    "a cost of 0 (a stored response's lookup) from a bucket in debt": (
        [100],
        [([250], True, [0]), ([0], True, [0]), ([1], False, [0])],
    ),
    "fractional costs add up": (
        [10],
        [([2.5], True, [7]), ([2.5], True, [5]), ([5.5], False, [5])],
    ),
}


def _errors(registry: CollectorRegistry | None = None) -> Counter:
    return Counter("errors", "", registry=registry or CollectorRegistry())


@pytest.fixture(params=["local", "redis", "redis, leased"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BucketStore]:
    if request.param == "local":
        yield LocalStore(clock=lambda: 1000.0)
        return
    async with running_redis() as server:
        shared = RedisStore(server.url, _errors())
        # The cases' limits are too small to lease a whole request: exact, as without leases.
        chosen = LeasedStore(shared, lease_s=0.5) if request.param.endswith("leased") else shared
        yield chosen
        await chosen.close()


@pytest.mark.parametrize("case", list(CASES))
async def test_both_stores_take_by_the_same_rules(store: BucketStore, case: str) -> None:
    sizes, steps = CASES[case]
    limits = [Limit(s) for s in sizes]
    keys = [f"{{t}}:{i}" for i in range(len(sizes))]
    for costs, admitted, remaining in steps:
        verdict = await store.take(keys, limits, costs)
        assert verdict is not None
        assert verdict.allowed is admitted, (costs, verdict)
        assert [int(v.remaining) for v in verdict.views] == remaining


async def test_on_both_stores_a_huge_cost_leaves_a_debt_of_one_bucket_at_most(
    store: BucketStore,
) -> None:
    limit = Limit(600)  # 10 a second
    assert (verdict := await store.take(["{t}:tokens"], [limit], [5000])) and verdict.allowed
    refused = await store.take(["{t}:tokens"], [limit], [2])
    assert refused is not None and not refused.allowed
    # Owing 600 and needing 2: 60.2 s, not the 440 s the whole estimate would make it.
    assert 60 < refused.retry_after_s < 61


async def test_on_both_stores_a_limit_lowered_after_use_keeps_the_wait_to_about_a_minute(
    store: BucketStore,
) -> None:
    spent = await store.take(["{t}:requests"], [Limit(600)], [600])  # the whole burst
    assert spent is not None and spent.allowed
    # Lowered by a reload to 10 per minute: 600 used is one bucket's debt (20), not 60 of them.
    refused = await store.take(["{t}:requests"], [Limit(10)], [1])
    assert refused is not None and not refused.allowed
    assert 60 < refused.retry_after_s < 67  # (20 - 10 + 1) at 10 a minute: 66 s, not an hour
    assert refused.views[0].reset_s <= 120


async def test_a_lowered_limit_is_kept_in_redis_as_long_as_its_answer_says() -> None:
    async with running_redis() as server:
        store = RedisStore(server.url, _errors())
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            await store.take(["{t}:requests"], [Limit(600)], [600])
            refused = await store.take(["{t}:requests"], [Limit(10)], [1])
            assert refused is not None and not refused.allowed
            # The bucket outlives the wait it announced: the retry after it is the first
            # admitted, not a request 5 s earlier (the TTL the larger size had set).
            ttl_ms = await client.pttl("llm-gateway:ratelimit:{t}:requests")
            assert ttl_ms >= refused.retry_after_s * 1000
        finally:
            await client.aclose()
            await store.close()


async def test_a_leased_bucket_admits_a_cost_above_its_size_once_full_with_the_lease_back() -> None:
    async with running_redis() as server:
        store = LeasedStore(RedisStore(server.url, _errors()), lease_s=0.5)
        tokens = Limit(1200)  # leases of 10 tokens
        try:
            assert (await store.take(["{t}:tokens"], [tokens], [4])).allowed  # type: ignore[union-attr]
            early = await store.take(["{t}:tokens"], [tokens], [1300])
            # 4 used: not a full bucket yet, and the refusal shows which bucket is short.
            assert early is not None and not early.allowed
            assert early.views[0].remaining < 1200
            await asyncio.sleep(0.4)  # 8 back at 20 a second (6 short): full, the lease returned
            late = await store.take(["{t}:tokens"], [tokens], [1300])
            assert late is not None and late.allowed, late
        finally:
            await store.close()


async def test_adjust_refunds_and_charges_on_both_stores(store: BucketStore) -> None:
    limit = Limit(100)
    await store.take(["{t}:tokens"], [limit], [80])
    await store.adjust("{t}:tokens", limit, -50)  # used 30 of the 80 estimated
    verdict = await store.take(["{t}:tokens"], [limit], [70])
    assert verdict is not None and verdict.allowed
    await store.adjust("{t}:tokens", limit, 40)  # used 40 more than estimated: in debt
    verdict = await store.take(["{t}:tokens"], [limit], [1])
    assert verdict is not None and not verdict.allowed
    assert verdict.retry_after_s == pytest.approx((1 + 40) * 60 / 100, rel=0.01)


async def test_tenants_have_separate_buckets(store: BucketStore) -> None:
    one = [Limit(1)]
    assert (await store.take(["{a}:requests"], one, [1])).allowed  # type: ignore[union-attr]
    assert (await store.take(["{b}:requests"], one, [1])).allowed  # type: ignore[union-attr]
    assert not (await store.take(["{a}:requests"], one, [1])).allowed  # type: ignore[union-attr]


async def test_redis_buckets_are_exact_under_concurrent_takes_from_many_clients() -> None:
    async with running_redis() as server:
        stores = [RedisStore(server.url, _errors()) for _ in range(4)]
        try:
            verdicts = await asyncio.gather(
                *(stores[i % 4].take(["{t}:requests"], [Limit(25)], [1]) for i in range(100))
            )
        finally:
            for s in stores:
                await s.close()
    assert sum(1 for v in verdicts if v is not None and v.allowed) == 25


async def test_redis_down_fails_open_once_logged_and_counted_then_limits_return(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    errors = _errors(registry)
    async with running_redis() as server:
        store = RedisStore(server.url, errors, timeout_s=0.5, retry_s=0.0)
        try:
            one = [Limit(1)]
            assert (await store.take(["{t}:requests"], one, [1])).allowed  # type: ignore[union-attr]
            await server.kill()
            with caplog.at_level(logging.WARNING, logger="gateway.rate_limit.redis_store"):
                assert await store.take(["{t}:requests"], one, [1]) is None  # served
                assert await store.take(["{t}:requests"], one, [1]) is None
                await store.adjust("{t}:tokens", Limit(100), -5.0)  # a correction: no request
            assert registry.get_sample_value("errors_total") == 2  # the requests served unlimited
            assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
            await server.restart()  # empty: the buckets are soft state, full again
            assert (await store.take(["{t}:requests"], one, [1])).allowed  # type: ignore[union-attr]
            assert not (await store.take(["{t}:requests"], one, [1])).allowed  # type: ignore[union-attr]
        finally:
            await store.close()


async def test_a_redis_out_of_memory_is_logged_as_refusing_writes_not_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_redis() as server:
        admin = redis.asyncio.from_url(server.url)
        store = RedisStore(server.url, _errors(), timeout_s=0.5, retry_s=0.0)
        try:
            await admin.config_set("maxmemory", "1")  # noeviction: every write refused
            with caplog.at_level(logging.WARNING, logger="gateway.rate_limit.redis_store"):
                assert await store.take(["{t}:requests"], [Limit(5)], [1]) is None  # served
            [warning] = [r.getMessage() for r in caplog.records]
            assert "Redis refuses writes" in warning
        finally:
            await admin.config_set("maxmemory", "0")
            await admin.aclose()
            await store.close()


async def test_redis_too_slow_fails_open_too() -> None:
    registry = CollectorRegistry()
    async with running_redis() as server:
        store = RedisStore(server.url, _errors(registry), timeout_s=0.2, retry_s=0.0)
        try:
            one = [Limit(1)]
            assert (await store.take(["{t}:requests"], one, [1])).allowed  # type: ignore[union-attr]
            os.kill(server.pid, signal.SIGSTOP)  # alive, connected, silent
            try:
                assert await store.take(["{t}:requests"], one, [1]) is None
            finally:
                os.kill(server.pid, signal.SIGCONT)
            assert registry.get_sample_value("errors_total") == 1
            # Back: the bucket it kept is still spent.
            verdict = await store.take(["{t}:requests"], one, [1])
            assert verdict is not None and not verdict.allowed
        finally:
            await store.close()


async def test_a_busy_tenant_costs_one_redis_call_per_lease_not_per_request() -> None:
    async with running_redis() as server:
        # 6,000 per minute, leases of 0.5 s: 50 requests per call to Redis.
        store = LeasedStore(RedisStore(server.url, _errors()), lease_s=0.5)
        before = await script_calls(server.url)
        verdicts = [await store.take(["{t}:requests"], [Limit(6000)], [1]) for _ in range(500)]
        calls = await script_calls(server.url) - before
        await store.close()
    assert all(v is not None and v.allowed for v in verdicts)
    assert calls <= 500 / 50 + 1
    remaining = [v.views[0].remaining for v in verdicts if v is not None]
    assert remaining[:3] == pytest.approx([5999, 5998, 5997], abs=1)  # the headers count down


async def test_requests_arriving_while_a_lease_is_renewed_wait_for_it() -> None:
    async with running_redis() as server:
        store = LeasedStore(RedisStore(server.url, _errors()), lease_s=0.5)
        before = await script_calls(server.url)
        verdicts = await asyncio.gather(
            *(store.take(["{t}:requests"], [Limit(6000)], [1]) for _ in range(200))
        )
        calls = await script_calls(server.url) - before
        await store.close()
    assert all(v is not None and v.allowed for v in verdicts)
    assert calls <= 200 / 50 + 1  # one renewal per lease, not one per waiting request


async def test_requests_no_lease_could_cover_go_to_redis_at_once_not_in_line() -> None:
    class Watched(RedisStore):
        in_flight = most = 0

        async def take_leasing(self, *args: Any) -> Any:
            Watched.in_flight += 1
            Watched.most = max(Watched.most, Watched.in_flight)
            try:
                return await super().take_leasing(*args)
            finally:
                Watched.in_flight -= 1

    async with running_redis() as server:
        store = LeasedStore(Watched(server.url, _errors()), lease_s=0.5)
        tokens = Limit(200_000)  # leases of 1,666 tokens
        verdicts = await asyncio.gather(
            *(store.take(["{t}:tokens"], [tokens], [2_000]) for _ in range(20))
        )
        await store.close()
    assert all(v is not None and v.allowed for v in verdicts)
    assert Watched.most > 1  # each its own round trip, side by side


async def test_instances_leasing_never_admit_more_than_the_limit_together() -> None:
    async with running_redis() as server:
        # Leases of 60 requests out of 600 per minute: two instances, 1,000 requests.
        stores = [LeasedStore(RedisStore(server.url, _errors()), lease_s=6.0) for _ in range(2)]
        verdicts = [
            await stores[i % 2].take(["{t}:requests"], [Limit(600)], [1]) for i in range(1000)
        ]
        for store in stores:
            await store.close()
    admitted = sum(1 for v in verdicts if v is not None and v.allowed)
    # Redis refills 10 a second while this runs; an instance may be left holding one lease.
    assert 600 - 60 <= admitted <= 600 + 10


async def test_a_refund_goes_back_into_the_lease_instead_of_to_redis() -> None:
    async with running_redis() as server:
        store = LeasedStore(RedisStore(server.url, _errors()), lease_s=0.5)
        tokens = Limit(60_000)  # leases of 500 tokens
        await store.take(["{t}:tokens"], [tokens], [400])  # from Redis, with the lease
        before = await script_calls(server.url)
        first = await store.take(["{t}:tokens"], [tokens], [400])  # from the lease: 100 left
        await store.adjust("{t}:tokens", tokens, -300)  # estimated 400, used 100
        second = await store.take(["{t}:tokens"], [tokens], [350])  # 100 + 300 left: local
        calls = await script_calls(server.url) - before
        await store.close()
    assert first is not None and second is not None and second.allowed
    assert calls == 0
    assert second.views[0].remaining == pytest.approx(60_000 - 400 - 100 - 350, abs=2)
