"""A stored response stays its owner's, however its id reaches the gateway: with tenants a
client may not choose a response's id (vLLM would take it from the body's `request_id`), an id
the gateway knows never changes owner (here, from another worker, or through Redis), and an
id whose owner the gateway cannot tell is found by no key, an `allow_unknown_keys` one
included."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI

from bench.launcher import start_gateway
from gateway.routing.affinity import ReplicaRef, ResponseHomes, RouteHooks, RoutingMemory
from gateway.shared_state import responses
from replica.processes import ManagedProcess
from tests.conftest import FAST_PROBES, MODEL, eventually, pool_policy, running_sims
from tests.rate_limits import ACME_KEY, GLOBEX_KEY, tenant
from tests.redis_server import running_redis
from tests.shared_state import fleet, redis_state, started

RESPONSE_ID = "resp_0123456789abcdef0123456789abcdef"
ANSWER = b'{"id": "%s", "object": "response", "status": "completed"}' % RESPONSE_ID.encode()


@contextlib.asynccontextmanager
async def gateway_with(
    limits: dict[str, Any] | None,
) -> AsyncIterator[tuple[ManagedProcess, ManagedProcess]]:
    """(the gateway, its one sim replica), the policy with ``limits`` (None: no section)."""
    async with running_sims(1) as replicas:
        policy = pool_policy([replicas[0].url])
        if limits is not None:
            policy["limits"] = limits
        gateway = await start_gateway(policy, env=FAST_PROBES)
        try:
            yield gateway, replicas[0]
        finally:
            await gateway.stop()


TENANTS = {"tenants": {"acme": tenant(ACME_KEY), "globex": tenant(GLOBEX_KEY)}}


async def post_response(gateway: ManagedProcess, key: str | None, **body: Any) -> tuple[int, Any]:
    auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
    request = {"model": MODEL, "input": "Where is my parcel?", "max_output_tokens": 2, **body}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/responses", json=request, headers=auth) as answer,
    ):
        return answer.status, await answer.json()


async def test_with_tenants_a_client_chosen_response_id_is_refused_for_every_key() -> None:
    async with gateway_with({**TENANTS, "allow_unknown_keys": True}) as (gateway, _):
        for key in (GLOBEX_KEY, "sk-anyone-else"):
            status, body = await post_response(gateway, key, request_id=RESPONSE_ID, store=False)
            assert status == 400, key
            assert body["error"]["param"] == "request_id"
            assert "the gateway names stored responses" in body["error"]["message"]
        # Without it, the same request is served.
        status, _ = await post_response(gateway, GLOBEX_KEY, store=False)
        assert status == 200


async def test_without_tenants_a_request_id_is_left_to_the_replica() -> None:
    async with gateway_with(None) as (gateway, _):
        status, _ = await post_response(gateway, None, request_id=RESPONSE_ID)
    assert status == 200  # the sim ignores the field; vLLM would take it as the response's id


def answered_by(memory: RoutingMemory, owner: str | None, replica: str) -> None:
    """The gateway relays ``ANSWER`` from ``replica`` to a request of ``owner``."""
    hooks = RouteHooks(memory, "small", learn_response_id=True, owner=owner)
    hooks.answered(replica, 200, ANSWER)


def test_a_remembered_response_id_keeps_its_first_owner() -> None:
    memory = RoutingMemory()
    published: list[tuple[str, ReplicaRef]] = []
    memory.responses.publish = lambda response_id, home: published.append((response_id, home))
    answered_by(memory, "acme", "replica-1")
    answered_by(memory, "globex", "replica-2")  # an answer carrying acme's id
    alpha = ReplicaRef("small", "replica-1", "acme")
    assert memory.responses.get(RESPONSE_ID) == alpha
    assert published == [(RESPONSE_ID, alpha)]  # nor told to the other processes
    # Nor from another process.
    assert not memory.responses.learn(RESPONSE_ID, ReplicaRef("small", "replica-2", "globex"))
    assert memory.responses.get(RESPONSE_ID) == alpha


def test_the_same_owner_moves_its_response_to_where_it_was_stored_again() -> None:
    homes = ResponseHomes()
    for replica in ("replica-1", "replica-2"):
        assert homes.learn(RESPONSE_ID, ReplicaRef("small", replica, None))
    assert homes.get(RESPONSE_ID) == ReplicaRef("small", "replica-2", None)


async def test_through_redis_a_response_id_keeps_its_first_owner_on_every_instance() -> None:
    async with running_redis() as server:
        first, second = redis_state(server.url), redis_state(server.url)
        memories = RoutingMemory(), RoutingMemory()
        for state, memory in zip((first, second), memories, strict=True):
            state.share_memory(memory)
            await started(state, fleet())
        client = aioredis.from_url(server.url)
        key = f"{first.settings.key_prefix}:response:{RESPONSE_ID}"
        try:
            assert await eventually(lambda: first.up and second.up)
            alpha = ReplicaRef("small", "replica-1", "acme")
            answered_by(memories[0], "acme", "replica-1")
            assert await eventually(lambda: _stored(client, key, alpha))
            # The second instance never saw acme's answer: globex's claim is refused by Redis,
            # and the second instance learns whose the id is.
            answered_by(memories[1], "globex", "replica-2")
            assert await eventually(lambda: memories[1].responses.get(RESPONSE_ID) == alpha)
            assert await _stored(client, key, alpha)
            # The same owner's home still moves (no tenants: every owner is None).
            other = "resp_fedcba9876543210fedcba9876543210"
            other_key = f"{first.settings.key_prefix}:response:{other}"
            memories[0].responses.remember(other, ReplicaRef("small", "replica-1"))
            assert await eventually(
                lambda: _stored(client, other_key, ReplicaRef("small", "replica-1"))
            )
            memories[1].responses.remember(other, ReplicaRef("small", "replica-2"))
            assert await eventually(
                lambda: _stored(client, other_key, ReplicaRef("small", "replica-2"))
            )
        finally:
            await client.aclose()
            await first.stop()
            await second.stop()


async def _stored(client: aioredis.Redis, key: str, home: ReplicaRef) -> bool:
    raw = await client.get(key)
    found = responses.decode(raw) if isinstance(raw, bytes) else None
    return found is not None and found[1] == home


async def test_with_tenants_no_key_continues_a_response_whose_owner_is_unknown() -> None:
    # Stored where the gateway did not see it (as after a restart): routed anyway, a tenant's
    # response would be read wherever the replica happens to hold it.
    async with (
        gateway_with({**TENANTS, "allow_unknown_keys": True}) as (gateway, replica),
        AsyncOpenAI(base_url=f"{replica.url}/v1", api_key="-", max_retries=0) as direct,
        AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="sk-anyone-else", max_retries=0
        ) as anonymous,
    ):
        unseen = await direct.responses.create(model=MODEL, input="Whose?", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError) as follow:
            await anonymous.responses.create(
                model=MODEL, input="Mine?", previous_response_id=unseen.id
            )
    assert follow.value.param == "previous_response_id"


async def test_with_tenants_a_response_no_tenant_stored_is_no_tenants_to_read() -> None:
    """A key `allow_unknown_keys` lets in stores a response with no owner: the keys without a
    tenant may read it, as they share everything; a tenant may not, knowing its id or not."""
    async with (
        gateway_with({**TENANTS, "allow_unknown_keys": True}) as (gateway, _),
        AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key="sk-anyone-else", max_retries=0
        ) as anonymous,
        AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=ACME_KEY, max_retries=0) as acme,
    ):
        stored = await anonymous.responses.create(model=MODEL, input="Mine", max_output_tokens=2)
        assert (await anonymous.responses.retrieve(stored.id)).id == stored.id
        with pytest.raises(openai.NotFoundError):
            await acme.responses.retrieve(stored.id)
