"""Shared helpers of the shared-state tests. Without Redis: a fleet of one pool of four
replicas, a long system prompt's request dispatched away from its
home, and a check that a pool now routes it there. Of gateway processes that share: the admin
token they are started with, a system prompt per conversation, and checks that their backend
is up (every worker of `serve --workers N` connected to every other). Of the Redis backend in
the test's process: one made, started and stopped within a bound."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from gateway.fleet.pools import Fleet, PoolState
from gateway.shared_state import Outbox
from gateway.shared_state.redis_state import RedisSettings, RedisState
from replica.processes import ManagedProcess
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures
from router_policies.schema import parse_policy
from tests.conftest import MODEL, metric_sum, pool_policy

URLS = [f"http://127.0.0.1:{port}" for port in (9101, 9102, 9103, 9104)]
NAMES = [url.removeprefix("http://") for url in URLS]


def fleet() -> Fleet:
    return Fleet(parse_policy(pool_policy(URLS)))


def pool_of(f: Fleet) -> PoolState:
    return f.pools["small"]


def features(pool: PoolState, system: str) -> RequestFeatures:
    text = system.encode()
    return pool.router.features(MODEL, lambda: CanonicalPrompt(text, lead_bytes=len(text)))


SYSTEM = "You are a careful assistant. " * 200


def dispatch_to(pool: PoolState, replica: str, request: RequestFeatures) -> None:
    decision = pool.decide(request)
    assert decision is not None
    pool.begin(dataclasses.replace(decision, replica=replica), request)


def dispatch_away_from_home(pool: PoolState) -> tuple[RequestFeatures, str]:
    """SYSTEM's request dispatched to a replica that is not its cold-start home (which any
    instance would find by itself): (the request, that replica)."""
    request = features(pool, SYSTEM)
    home = pool.decide(request)
    assert home is not None
    chosen = next(n for n in NAMES if n != home.replica)
    dispatch_to(pool, chosen, request)
    return request, chosen


def routes_to(
    pool: PoolState, request: RequestFeatures, replica: str
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        decision = pool.decide(request)
        return decision is not None and decision.replica == replica

    return check


# -- gateway processes that share state ------------------------------------------------------------


ADMIN_TOKEN = "test-admin"


def system(i: int) -> str:
    return f"You are assistant number {i}. " + "Follow the house style guide closely. " * 60


def backend_up_is(
    gateway: ManagedProcess, value: float, backend: str = "redis"
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await metric_sum(gateway.url, "gateway_state_backend_up", backend=backend) == value

    return check


def every_worker_up(gateway: ManagedProcess) -> Callable[[], Awaitable[bool]]:
    """Whether every worker is connected to every other (/metrics answers for both)."""
    return backend_up_is(gateway, 2.0, "workers")


# -- the Redis backend in the test's process -------------------------------------------------------


WAIT_S = 10.0
"""Longest wait for a background effect (a replay, a reconnect): a bound, not a measurement."""


def redis_state(url: str, kind: type[RedisState] = RedisState, **settings: Any) -> RedisState:
    registry = CollectorRegistry()
    up = Gauge("up", "Redis answers", registry=registry)
    lag = Histogram("lag", "dispatch age on arrival", registry=registry)
    return kind(replace(RedisSettings(url), **settings), Outbox(), up, lag)


async def started(state: RedisState, fleet: Fleet) -> set[asyncio.Task[object]]:
    """Start ``state``; the background tasks that started."""
    before = asyncio.all_tasks()
    await state.start(lambda: fleet)
    return asyncio.all_tasks() - before


async def returns(step: Awaitable[None]) -> bool:
    """Whether ``step`` completes within ``WAIT_S``: a bound on a hang, not a measurement. Run
    as a task of its own, since a step that swallows cancellations would also swallow the one
    ``asyncio.timeout`` sends and hide its hang."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=WAIT_S)
    if not done:
        task.cancel()
        return False
    task.result()
    return True
