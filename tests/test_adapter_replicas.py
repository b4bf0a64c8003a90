"""Which replicas a LoRA adapter's request may go to when only some replicas serve it.

- Discovery keeps each replica's own list: a replica that stops listing an adapter stops
  getting it, and one that starts is found.
- A learned adapter goes only to the replicas that list it, on every attempt; none of them
  available: a 503 that names the adapter, never a replica's 404.
- A declared adapter goes only to the replicas that list it once an available one does;
  while none does, anywhere in the pool (vLLM may load it on demand).
- End to end: concurrent requests for an adapter one replica of two serves all reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway import headers
from gateway.fleet.adapter_discovery import discover_once
from gateway.fleet.pools import Fleet
from gateway.http.errors import ApiError
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.affinity import RouteHooks, RoutingMemory
from gateway.routing.resolve import resolve
from replica.sim.config import SimConfig
from replica.sim.server import build_app as build_sim_app
from router_policies.schema import parse_policy
from tests.conftest import MODEL, in_process_gateway

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
NAMES = [u.removeprefix("http://") for u in URLS]


def fleet(**pool: Any) -> Fleet:
    return Fleet(parse_policy({"pools": {"small": {"model": "m", "replicas": URLS, **pool}}}))


def hooks_for(f: Fleet, memory: RoutingMemory, model: str) -> RouteHooks:
    parsed = parse_request(Endpoint.COMPLETIONS, orjson.dumps({"model": model, "prompt": "x"}))
    hooks = resolve(f, parsed, None, memory).hooks
    assert hooks is not None
    return hooks


def allowed(hooks: RouteHooks, attempt: int, tried: list[str] | None = None) -> set[str]:
    return set(NAMES) - set(hooks.exclude(NAMES, tried or [], attempt))


def listing(f: Fleet, **by_replica: set[str]) -> RoutingMemory:
    """Replica i (r0, r1, ...) lists those adapters; the rest of the pool learned from them."""
    pool = f.pools["small"]
    learned: set[str] = set()
    for key, adapters in by_replica.items():
        pool.replicas[NAMES[int(key[1:])]].adapters = frozenset(adapters)
        learned |= adapters - set(pool.policy.adapters)
    return RoutingMemory(learned_adapters={"small": frozenset(learned)})


# --- discovery --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def model_lists(*lists: list[str]) -> AsyncIterator[tuple[Fleet, list[list[str]]]]:
    """Replicas whose /v1/models list the adapters in ``lists`` (mutable: edit to change)."""
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for adapters in lists:

            async def models(_: web.Request, adapters: list[str] = adapters) -> web.Response:
                cards = [{"id": "m", "parent": None}]
                cards += [{"id": a, "parent": "m"} for a in adapters]
                return web.json_response({"object": "list", "data": cards})

            app = web.Application()
            app.router.add_get("/v1/models", models)
            server = await stack.enter_async_context(TestServer(app, host="127.0.0.1"))
            urls.append(str(server.make_url("")).rstrip("/"))
        f = Fleet(parse_policy({"pools": {"small": {"model": "m", "replicas": urls}}}))
        yield f, list(lists)


async def test_discovery_keeps_each_replicas_own_adapters_and_follows_their_changes() -> None:
    async with model_lists(["tone", "sql"], []) as (f, lists), aiohttp.ClientSession() as s:
        first, second = f.pools["small"].replicas.values()
        learned: dict[str, frozenset[str]] = {}
        await discover_once(f, s, learned)
        assert learned == {"small": {"tone", "sql"}}
        assert first.adapters == {"tone", "sql"} and second.adapters == frozenset()
        lists[0].remove("tone")
        lists[1].append("new")
        await discover_once(f, s, learned)
        assert learned == {"small": {"sql", "new"}}
        assert first.adapters == {"sql"} and second.adapters == {"new"}
        # A replica that does not answer keeps what it listed last.
        second.healthy = False
        lists[1].clear()
        await discover_once(f, s, learned)
        assert second.adapters == {"new"} and learned == {"small": {"sql", "new"}}


# --- learned adapters -------------------------------------------------------------------------


def test_a_learned_adapter_goes_only_to_the_replicas_that_list_it_on_every_attempt() -> None:
    f = fleet()
    memory = listing(f, r0={"tone"}, r2={"tone"}, r1={"other"})
    hooks = hooks_for(f, memory, "tone")
    assert allowed(hooks, 0) <= {NAMES[0], NAMES[2]} and allowed(hooks, 0)
    assert allowed(hooks, 1, [NAMES[0]]) == {NAMES[2]}
    assert not hooks.pinned  # not a stored response: the route is the policy's own


def test_a_learned_adapter_stays_on_its_replicas_however_busy_they_are() -> None:
    f = fleet()
    memory = listing(f, r1={"tone"})
    f.pools["small"].replicas[NAMES[1]].inflight = 50
    assert allowed(hooks_for(f, memory, "tone"), 0) == {NAMES[1]}


def test_a_warm_replica_at_its_in_flight_limit_is_no_preference() -> None:
    """With `max_inflight_per_replica`, a preferred replica at its limit would keep the request
    waiting for a slot there while another replica listing the adapter has room."""
    f = fleet(max_inflight_per_replica=1)
    memory = listing(f, r0={"tone"}, r1={"tone"})
    home = allowed(hooks_for(f, memory, "tone"), 0)
    assert len(home) == 1
    f.pools["small"].replicas[next(iter(home))].inflight = 1
    assert allowed(hooks_for(f, memory, "tone"), 0) == {NAMES[0], NAMES[1]} - home


def test_a_learned_adapter_with_no_available_replica_listing_it_is_a_clear_503() -> None:
    f = fleet()
    memory = listing(f, r1={"tone"})
    f.pools["small"].replicas[NAMES[1]].healthy = False
    with pytest.raises(ApiError) as error:
        hooks_for(f, memory, "tone")
    assert error.value.status == 503 and "'tone'" in error.value.message
    assert error.value.param == "model"


# --- declared adapters ------------------------------------------------------------------------


def test_a_declared_adapter_no_replica_lists_may_go_anywhere_after_its_first_try() -> None:
    f = fleet(adapters=["sql"])
    hooks = hooks_for(f, RoutingMemory(), "sql")
    assert len(allowed(hooks, 0)) == 1  # its rendezvous home first
    assert allowed(hooks, 1, []) == set(NAMES)


def test_a_declared_adapter_a_replica_lists_goes_only_there_even_when_busy() -> None:
    f = fleet(adapters=["sql"])
    memory = listing(f, r2={"sql"})
    f.pools["small"].replicas[NAMES[2]].inflight = 50
    hooks = hooks_for(f, memory, "sql")
    assert allowed(hooks, 0) == {NAMES[2]} and allowed(hooks, 1) == {NAMES[2]}


def test_a_declared_adapter_whose_listing_replicas_are_down_falls_back_to_the_pool() -> None:
    f = fleet(adapters=["sql"])
    memory = listing(f, r2={"sql"})
    f.pools["small"].replicas[NAMES[2]].healthy = False
    hooks = hooks_for(f, memory, "sql")
    assert allowed(hooks, 1) == set(NAMES)


def test_a_base_model_request_is_not_restricted_by_adapters() -> None:
    f = fleet(adapters=["sql"])
    memory = listing(f, r2={"sql", "tone"})
    parsed = parse_request(Endpoint.COMPLETIONS, orjson.dumps({"model": "m", "prompt": "x"}))
    assert resolve(f, parsed, None, memory).hooks is None


# --- end to end -------------------------------------------------------------------------------


async def test_concurrent_requests_for_an_adapter_one_replica_serves_all_reach_it() -> None:
    configs = [
        SimConfig.model_validate({"model": MODEL, "lora_modules": "sql-lora=/a/sql tone"}),
        SimConfig.model_validate({"model": MODEL}),
    ]
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for config in configs:
            server = TestServer(build_sim_app(config), host="127.0.0.1")
            await stack.enter_async_context(server)
            urls.append(str(server.make_url("")).rstrip("/"))
        policy = {"pools": {"small": {"model": MODEL, "replicas": urls, "adapters": ["sql-lora"]}}}
        client = await stack.enter_async_context(in_process_gateway(policy))
        for _ in range(100):
            listed = await (await client.get("/v1/models")).json()
            if "tone" in {card["id"] for card in listed["data"]}:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the adapter was never learned")
        served = urls[0].removeprefix("http://")

        async def one(model: str, i: int) -> tuple[int, str | None]:
            body = {"model": model, "prompt": f"q {i}", "max_tokens": 8}
            response = await client.post("/v1/completions", json=body)
            return response.status, response.headers.get(headers.REPLICA)

        for model in ("tone", "sql-lora"):
            answers = await asyncio.gather(*(one(model, i) for i in range(10)))
            assert set(answers) == {(200, served)}, model
