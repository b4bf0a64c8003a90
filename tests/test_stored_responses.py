"""A response stored through one gateway process is found through every other, and only by
the tenant that stored it: `GET /v1/responses/{id}` and `previous_response_id` follow-ups
reach the replica holding it whichever worker of `serve --workers 2` or which of two instances
sharing Redis they land on; the lookup endpoints check the key and count against the request
limit like the generating ones, and another tenant's key finds nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from bench.launcher import start_gateway
from gateway import headers
from gateway.routing.affinity import ReplicaRef
from gateway.shared_state import responses
from replica.processes import ManagedProcess
from tests.conftest import FAST_PROBES, MODEL, eventually, pool_policy, running_sims
from tests.rate_limits import ACME_KEY, GLOBEX_KEY, lookups_need_a_key, tenant
from tests.redis_server import running_redis
from tests.shared_state import every_worker_up

ROUNDS = 12


@contextlib.asynccontextmanager
async def fresh_connections(url: str, key: str = "unused") -> AsyncIterator[AsyncOpenAI]:
    """The official client, on a new connection per request (the gateway closes each after its
    answer): the kernel then picks the worker of `--workers N` anew each time."""
    async with AsyncOpenAI(
        base_url=f"{url}/v1", api_key=key, max_retries=0, default_headers={"Connection": "close"}
    ) as client:
        yield client


async def store(client: AsyncOpenAI, i: int) -> tuple[str, str, str]:
    """(response id, replica, serving process) of a new stored response."""
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=f"Conversation {i}: where is my parcel?", max_output_tokens=3
    )
    h = raw.headers
    return raw.parse().id, h[headers.REPLICA], h[headers.REQUEST_ID][:12]


async def found_everywhere(stored: list[tuple[str, str, str]], client: AsyncOpenAI) -> set[str]:
    """Retrieves and continues every stored response (asserting each succeeds on the replica
    that stored it); the processes that served those calls."""
    processes = set()
    for response_id, replica, _ in stored:
        got = await client.responses.with_raw_response.retrieve(response_id)
        assert got.parse().id == response_id
        assert got.headers[headers.REPLICA] == replica
        follow = await client.responses.with_raw_response.create(
            model=MODEL, input="And when?", previous_response_id=response_id, max_output_tokens=2
        )
        assert follow.parse().previous_response_id == response_id
        assert follow.headers[headers.REPLICA] == replica
        processes |= {got.headers[headers.REQUEST_ID][:12], follow.headers[headers.REQUEST_ID][:12]}
    return processes


async def test_through_two_workers_every_stored_response_is_found_by_either() -> None:
    async with running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        try:
            assert await eventually(every_worker_up(gateway))
            async with fresh_connections(gateway.url) as client:
                stored = [await store(client, i) for i in range(ROUNDS)]
                served = await found_everywhere(stored, client)
        finally:
            assert await gateway.stop() == 0
    # Both workers stored some and both answered lookups: each found the other's.
    assert len({process for _, _, process in stored}) == 2
    assert len(served) == 2


async def test_through_two_instances_sharing_redis_each_finds_the_others_responses() -> None:
    async with running_redis() as redis, running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_REDIS_URL": redis.url}
        policy = pool_policy([r.url for r in replicas])
        first, second = await asyncio.gather(*(start_gateway(policy, env=env) for _ in range(2)))
        try:
            async with (
                fresh_connections(first.url) as through_first,
                fresh_connections(second.url) as through_second,
            ):
                stored = [await store(through_first, i) for i in range(ROUNDS)]
                await found_everywhere(stored, through_second)
        finally:
            await asyncio.gather(first.stop(), second.stop())


@contextlib.asynccontextmanager
async def tenants_gateway(**acme_limits: int) -> AsyncIterator[ManagedProcess]:
    async with running_sims(1) as replicas:
        policy = {
            **pool_policy([replicas[0].url]),
            "limits": {
                "tenants": {"acme": tenant(ACME_KEY, **acme_limits), "globex": tenant(GLOBEX_KEY)}
            },
        }
        gateway = await start_gateway(policy, env=FAST_PROBES)
        try:
            yield gateway
        finally:
            await gateway.stop()


async def test_lookups_need_a_key_and_find_only_the_tenants_own_responses() -> None:
    async with (
        tenants_gateway() as gateway,
        fresh_connections(gateway.url, ACME_KEY) as acme,
        fresh_connections(gateway.url, GLOBEX_KEY) as globex,
        aiohttp.ClientSession(gateway.url) as anonymous,
    ):
        response_id, _, _ = await store(acme, 0)
        assert (await acme.responses.retrieve(response_id)).id == response_id
        await lookups_need_a_key(anonymous, response_id)
        with pytest.raises(openai.NotFoundError):
            await globex.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            await globex.responses.cancel(response_id)
        with pytest.raises(openai.NotFoundError) as follow:
            await globex.responses.create(
                model=MODEL, input="Mine now?", previous_response_id=response_id
            )
        assert follow.value.param == "previous_response_id"
        # The owner still continues it.
        again = await acme.responses.create(
            model=MODEL, input="And when?", previous_response_id=response_id, max_output_tokens=2
        )
        assert again.previous_response_id == response_id


async def test_a_tenant_cannot_continue_a_response_whose_owner_the_gateway_cannot_tell() -> None:
    # Stored where the gateway did not see it (as after Redis restarted empty): routed anyway,
    # another tenant's response would be read wherever the replica happens to hold it.
    async with tenants_gateway() as gateway, fresh_connections(gateway.url, ACME_KEY) as acme:
        _, replica, _ = await store(acme, 0)
        async with AsyncOpenAI(
            base_url=f"http://{replica}/v1", api_key="-", max_retries=0
        ) as direct:
            unseen = await direct.responses.create(model=MODEL, input="Whose?", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError) as follow:
            await acme.responses.create(model=MODEL, input="Mine?", previous_response_id=unseen.id)
        assert follow.value.param == "previous_response_id"


async def test_lookups_count_against_the_tenants_request_limit() -> None:
    async with (
        tenants_gateway(requests_per_minute=3) as gateway,
        fresh_connections(gateway.url, ACME_KEY) as acme,
    ):
        response_id, _, _ = await store(acme, 0)
        await acme.responses.retrieve(response_id)
        await acme.responses.retrieve(response_id)
        with pytest.raises(openai.RateLimitError):
            await acme.responses.retrieve(response_id)


async def test_every_lookup_answer_to_a_tenant_with_limits_carries_its_ratelimit_headers() -> None:
    auth = {"Authorization": f"Bearer {ACME_KEY}"}
    async with (
        tenants_gateway(requests_per_minute=10) as gateway,
        fresh_connections(gateway.url, ACME_KEY) as acme,
        aiohttp.ClientSession(gateway.url, headers=auth) as session,
    ):
        response_id, _, _ = await store(acme, 0)
        remaining = []
        for method, path in (
            ("GET", f"/v1/responses/{response_id}"),  # relayed from the replica
            ("POST", f"/v1/responses/{response_id}/cancel"),
            ("GET", "/v1/responses/resp_unknown"),  # answered by the gateway: 404
        ):
            async with session.request(method, path) as answer:
                assert answer.headers[headers.RATELIMIT_LIMIT_REQUESTS] == "10", path
                assert headers.RATELIMIT_RESET_REQUESTS in answer.headers
                remaining.append(answer.headers[headers.RATELIMIT_REMAINING_REQUESTS])
        assert answer.status == 404
    assert remaining == ["8", "7", "6"]  # after the request that stored it


def test_a_shared_home_survives_its_encoding_and_garbage_is_ignored() -> None:
    home = ReplicaRef("pool-a", "replica-1", "acme")
    assert responses.decode(responses.encode("resp_1", home)) == ("resp_1", home)
    for garbage in (b"", b"{}", b"[1, 2, 3, 4]", b'["resp_1", "p", "r", 5]', b"\xff"):
        assert responses.decode(garbage) is None
