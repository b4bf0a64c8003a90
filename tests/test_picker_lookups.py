"""Behind Envoy, a stored response's lookups are `serve`'s (tests/test_stored_responses.py):
`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` reach the replica that stored the
response (vLLM keeps it in that server's memory), not the one Envoy's balancer would pick; they
need a tenant's key, count against its request limit, and find only its own responses. Real
processes: simulated replicas, the picker, Envoy."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from bench.envoy import EnvoyProcess
from gateway import headers
from tests.conftest import MODEL, eventually, get_text, metric
from tests.picker import behind_envoy
from tests.rate_limits import ACME_KEY, GLOBEX_KEY, lookups_need_a_key, tenant

pytestmark = pytest.mark.envoy

ROUNDS = 10
"""Stored responses looked up: with two replicas, one lookup in two would miss were it left to
Envoy's balancer; all of them reaching their replica by luck is a chance in a million."""


@contextlib.asynccontextmanager
async def sdk(envoy: EnvoyProcess, key: str = "unused") -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{envoy.listen_url}/v1", api_key=key, max_retries=0) as client:
        yield client


async def store(client: AsyncOpenAI, i: int) -> tuple[str, str]:
    """(response id, replica) of a new stored response."""
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=f"Conversation {i}: where is my parcel?", max_output_tokens=3
    )
    return raw.parse().id, raw.headers[headers.REPLICA]


def two_tenants(**acme_limits: int) -> dict[str, Any]:
    return {"tenants": {"acme": tenant(ACME_KEY, **acme_limits), "globex": tenant(GLOBEX_KEY)}}


async def test_every_stored_response_is_looked_up_on_the_replica_that_stored_it() -> None:
    async with (
        behind_envoy(2) as (picker, envoy, _),
        sdk(envoy) as client,
        aiohttp.ClientSession(envoy.listen_url) as session,
    ):
        stored = [await store(client, i) for i in range(ROUNDS)]
        assert len({replica for _, replica in stored}) == 2  # both replicas hold some
        for response_id, replica in stored:
            got = await client.responses.with_raw_response.retrieve(response_id)
            assert got.parse().id == response_id
            assert got.headers[headers.REPLICA] == replica
            assert got.headers[headers.ROUTE] == "pinned"
            assert got.headers[headers.POOL] == "small"
            assert got.headers[headers.REQUEST_ID]
            # Found there: the simulated replica, as vLLM, cannot cancel a response that is
            # not a background one (400); another replica would not know it (404). The SDK
            # sends no body; a client may send one.
            with pytest.raises(openai.BadRequestError) as cancelled:
                await client.responses.cancel(response_id)
            assert cancelled.value.response.headers[headers.REPLICA] == replica
            path = f"/v1/responses/{response_id}/cancel"
            async with session.post(path, json={}) as with_body:
                assert with_body.status == 400
                assert with_body.headers[headers.REPLICA] == replica

        async def counted_as_serve_counts_them() -> bool:
            """Pinned to the replica that holds the response, by the replica's status (each
            once the picker has seen its answer's end, just after the client)."""
            _, exposition = await get_text(f"{picker.url}/metrics")
            pinned = functools.partial(metric, exposition, "gateway_requests_total", route="pinned")
            return pinned(code="200") == ROUNDS and pinned(code="400") == 2 * ROUNDS

        assert await eventually(counted_as_serve_counts_them)


async def test_lookups_need_a_key_and_find_only_the_tenants_own_responses() -> None:
    async with (
        behind_envoy(1, limits=two_tenants()) as (_, envoy, _),
        sdk(envoy, ACME_KEY) as acme,
        sdk(envoy, GLOBEX_KEY) as globex,
        aiohttp.ClientSession(envoy.listen_url) as anonymous,
    ):
        response_id, replica = await store(acme, 0)
        for look_up in (globex.responses.retrieve, globex.responses.cancel):
            with pytest.raises(openai.NotFoundError) as missing:
                await look_up(response_id)
            # vLLM's own answer for an id it does not hold, as if there were no such response.
            assert missing.value.param == "response_id"
            assert response_id in missing.value.message
            assert headers.REPLICA not in missing.value.response.headers  # never relayed
            assert missing.value.response.headers[headers.REQUEST_ID]
        await lookups_need_a_key(anonymous, response_id)
        # The owner reads it.
        got = await acme.responses.with_raw_response.retrieve(response_id)
        assert got.parse().id == response_id
        assert got.headers[headers.REPLICA] == replica


async def test_lookups_count_against_the_tenants_request_limit() -> None:
    async with (
        behind_envoy(1, limits=two_tenants(requests_per_minute=3)) as (_, envoy, _),
        sdk(envoy, ACME_KEY) as acme,
    ):
        response_id, _ = await store(acme, 0)
        got = await acme.responses.with_raw_response.retrieve(response_id)
        assert got.headers[headers.RATELIMIT_LIMIT_REQUESTS] == "3"
        assert got.headers[headers.RATELIMIT_REMAINING_REQUESTS] == "1"
        await acme.responses.retrieve(response_id)
        with pytest.raises(openai.RateLimitError):
            await acme.responses.retrieve(response_id)
