"""Several real `llm-gateway serve` processes on one real redis-server act as one gateway: a
prefix learned through one instance is a hit through another, in-flight requests on one are
seen by the other, and Redis SIGKILLed mid-run costs no request and sharing resumes when it
returns. Stopping the Redis backend ends in a bounded time, whatever its rounds or Redis do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from bench.launcher import start_gateway
from gateway import headers
from gateway.fleet.pools import Fleet as RoutingFleet
from gateway.http.errors import ApiError
from gateway.http.responses_lookup import readable_home
from gateway.routing.affinity import RoutingMemory
from gateway.shared_state.redis_state import MOST_WRITES, RedisState
from replica.processes import ManagedProcess
from tests.conftest import FAST_PROBES, chat, eventually, metric_sum, pool_policy, running_sims
from tests.redis_server import RedisServer, running_redis
from tests.shared_state import (
    ADMIN_TOKEN,
    WAIT_S,
    backend_up_is,
    dispatch_away_from_home,
    pool_of,
    redis_state,
    returns,
    routes_to,
    started,
    system,
)
from tests.shared_state import fleet as routing_fleet


@dataclass
class Fleet:
    redis: RedisServer
    replicas: list[ManagedProcess]
    gateways: list[ManagedProcess]


@contextlib.asynccontextmanager
async def shared_fleet(instances: int = 2, **sim: Any) -> AsyncIterator[Fleet]:
    async with running_redis() as redis, running_sims(4, **sim) as replicas:
        policy = pool_policy([r.url for r in replicas])
        env = {
            **FAST_PROBES,
            "GATEWAY_REDIS_URL": redis.url, "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
        }  # fmt: skip
        gateways = await asyncio.gather(*(start_gateway(policy, env=env) for _ in range(instances)))
        try:
            yield Fleet(redis, replicas, list(gateways))
        finally:
            await asyncio.gather(*(g.stop() for g in gateways))


async def send(gateway: ManagedProcess, body: dict[str, object]) -> tuple[int, str, str]:
    """(status, replica, route) of one chat completion through ``gateway``."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=body) as response,
    ):
        await response.read()
        return (
            response.status,
            response.headers.get(headers.REPLICA, ""),
            response.headers.get(headers.ROUTE, ""),
        )


async def would_route(gateway: ManagedProcess, body: dict[str, object]) -> tuple[str, str]:
    """(replica, route) the gateway would choose for ``body`` now (POST /admin/route)."""
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/admin/route", json=body, headers=auth) as response,
    ):
        decision = await response.json()
        return decision["replica"], decision["route"]


async def replayed(gateway: ManagedProcess, at_least: float) -> bool:
    return await metric_sum(gateway.url, "gateway_state_apply_lag_seconds_count") >= at_least


async def test_a_prefix_learned_through_one_instance_is_a_hit_through_another() -> None:
    async with shared_fleet() as fleet:
        a, b = fleet.gateways
        status, home, route = await send(a, chat(system(1), "first question"))
        assert (status, route) == (200, "prefix-home")
        assert await eventually(lambda: replayed(b, 1))
        status, replica, route = await send(b, chat(system(1), "second question"))
        assert (status, replica, route) == (200, home, "prefix-hit")


async def test_requests_in_flight_through_one_instance_count_on_the_other() -> None:
    # Slow decoding keeps the requests in flight long enough to look at them.
    async with shared_fleet(decode_step_s=0.05) as fleet:
        a, b = fleet.gateways
        long = [
            asyncio.create_task(send(a, chat(system(i), "go", max_tokens=40))) for i in range(3)
        ]

        async def b_sees_them() -> bool:
            return await metric_sum(b.url, "gateway_replica_remote_inflight") == 3

        assert await eventually(b_sees_them)
        assert await metric_sum(b.url, "gateway_replica_inflight") == 0
        assert [s for s, _, _ in await asyncio.gather(*long)] == [200, 200, 200]

        async def b_sees_none() -> bool:
            return await metric_sum(b.url, "gateway_replica_remote_inflight") == 0

        assert await eventually(b_sees_none)


async def test_redis_killed_mid_run_fails_no_request_and_sharing_resumes_on_its_return() -> None:
    async with shared_fleet() as fleet:
        a, b = fleet.gateways
        for g in (a, b):
            assert await eventually(backend_up_is(g, 1))

        async def traffic(rounds: int) -> list[int]:
            statuses = []
            for i in range(rounds):
                replies = await asyncio.gather(
                    *(send(g, chat(system(100 + i % 7), f"q{i}")) for g in (a, b))
                )
                statuses += [s for s, _, _ in replies]
            return statuses

        running = asyncio.create_task(traffic(40))
        await asyncio.sleep(0.3)
        await fleet.redis.kill()
        for g in (a, b):
            assert await eventually(backend_up_is(g, 0))
        await fleet.redis.restart()
        statuses = await running
        assert statuses == [200] * len(statuses)
        for g in (a, b):
            assert await eventually(backend_up_is(g, 1))

        # Sharing resumed: a new prefix through A is a hit through B.
        _, home, _ = await send(a, chat(system(999), "after the outage"))

        async def b_learned_it() -> bool:
            return await would_route(b, chat(system(999), "again")) == (home, "prefix-hit")

        assert await eventually(b_learned_it)


# -- publishing ------------------------------------------------------------------------------------


async def test_a_quiet_instance_publishes_a_dispatch_at_once_not_at_its_next_interval() -> None:
    # Batching is for busy instances: the first dispatch after a quiet spell goes out at once,
    # so the others' staleness is a round trip, not up to an interval.
    interval_s = 5.0
    async with running_redis() as redis:
        here, there = routing_fleet(), routing_fleet()
        states = [
            redis_state(redis.url, publish_interval_s=interval_s, sync_interval_s=0.05)
            for _ in (here, there)
        ]
        for state, f in zip(states, (here, there), strict=True):
            await started(state, f)
        try:
            await asyncio.sleep(0.3)  # both know each other; any first publishing round is over
            request, chosen = dispatch_away_from_home(pool_of(here))
            assert await eventually(routes_to(pool_of(there), request, chosen), interval_s / 2)
        finally:
            for state in states:
                assert await returns(state.stop())


# -- stopping the backend ------------------------------------------------------------------------


class LosesOneCancellation(RedisState):
    """Its counts round swallows the first cancellation and carries on, as a redis-py command
    does now and then on Python 3.11: ``asyncio.wait_for`` returns rather than raises when the
    cancellation lands in the same loop turn as the command's completion."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.in_round = asyncio.Event()
        self.lost = 0

    async def _sync(self, fleet: RoutingFleet) -> bool:
        await super()._sync(fleet)
        if self.lost:
            return True
        self.in_round.set()
        try:
            await asyncio.Event().wait()  # a command in flight
        except asyncio.CancelledError:
            self.lost += 1  # ... that completes as the cancellation lands
        return True


async def test_stop_ends_every_round_even_one_that_lost_its_cancellation() -> None:
    async with running_redis() as redis:
        state = redis_state(redis.url, LosesOneCancellation)
        assert isinstance(state, LosesOneCancellation)
        rounds = await started(state, routing_fleet())
        async with asyncio.timeout(WAIT_S):  # a bound on a hang, not a measurement
            await state.in_round.wait()
        assert await returns(state.stop())
        assert state.lost == 1
        assert all(task.done() for task in rounds)
        client = aioredis.from_url(redis.url)
        try:
            # Its counts were withdrawn (once the rounds that write them had ended).
            instances = await client.zrange(f"{state.settings.key_prefix}:instances", 0, -1)
            assert state.instance.encode() not in instances
        finally:
            await client.aclose()


async def test_stop_returns_while_redis_is_frozen() -> None:
    async with running_redis() as redis:
        state = redis_state(redis.url)
        rounds = await started(state, routing_fleet())
        assert await eventually(lambda: _is_up(state))
        os.kill(redis.pid, signal.SIGSTOP)  # no reply to anything from here on
        try:
            assert await returns(state.stop())
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        assert all(task.done() for task in rounds)


async def _is_up(state: RedisState) -> bool:
    return state.up


async def test_redis_away_from_the_start_is_reported_once_and_never_as_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Nothing listens on the port. With no dispatch to publish and no other instance to
    # read, some rounds have nothing to send Redis: they must not count as its answer.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    state = redis_state(f"redis://127.0.0.1:{port}/0")
    ups: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="gateway.shared_state.redis_state"):
        await started(state, routing_fleet())
        deadline = time.monotonic() + 2.5  # several retries at 0.1, 0.2, 0.4, 0.8 s
        while time.monotonic() < deadline:
            ups.append(state.up)
            await asyncio.sleep(0.01)
        assert await returns(state.stop())
    lines = [r.getMessage() for r in caplog.records]
    assert not any(ups)
    assert sum("unreachable" in line for line in lines) == 1
    assert not any("is back" in line for line in lines)


@pytest.mark.parametrize("tenants", [True, False])
async def test_a_stored_response_whose_home_cannot_be_looked_up_is_a_503_to_retry(
    tenants: bool,
) -> None:
    # Another instance may well have stored it: "not found" would be final, and wrong.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    state = redis_state(f"redis://127.0.0.1:{port}/0")  # Redis away
    memory = RoutingMemory()
    state.share_memory(memory)
    with pytest.raises(ApiError) as refused:
        await readable_home(memory.responses, "resp_1", None, "previous_response_id", tenants)
    assert (refused.value.status, refused.value.code) == (503, "previous_response_unavailable")
    assert refused.value.param == "previous_response_id"


async def test_background_writes_redis_cannot_keep_up_with_are_bounded_not_piled_up() -> None:
    # Each holds one of the client's connections, which the counts round needs too.
    async with running_redis() as redis:
        state = redis_state(redis.url)
        memory = RoutingMemory()
        state.share_memory(memory)
        await started(state, routing_fleet())
        assert await eventually(lambda: _is_up(state))
        publish = memory.large_conversations.publish
        assert publish is not None
        os.kill(redis.pid, signal.SIGSTOP)  # every write now waits
        try:
            for i in range(200):
                publish("m", i)
            assert len(state._writes) == MOST_WRITES
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        assert await returns(state.stop())
