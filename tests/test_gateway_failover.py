"""Failures: a dead replica, a replica answering 5xx, a stream that breaks, a client that leaves."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import APIError, AsyncOpenAI, BadRequestError
from openai.types.chat import ChatCompletionStreamOptionsParam

from gateway import headers
from replica.processes import ManagedProcess, sim_replica_argv
from tests.conftest import (
    MODEL,
    Handler,
    breaks_mid_stream,
    chat,
    eventually,
    fake_replica,
    get_text,
    metric,
    running_gateway,
    running_sims,
)


async def post_chat(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, str]:
    body = orjson.dumps(chat(f"Tenant {i} system prompt. " * 20, "hi", max_tokens=2))
    async with session.post(f"{url}/v1/chat/completions", data=body) as response:
        await response.read()
        return response.status, response.headers.get(headers.REPLICA, "")


async def test_a_killed_replica_is_routed_around_and_used_again_when_back() -> None:
    async with running_sims(3) as replicas:
        victim = replicas[0]
        victim_name = victim.url.removeprefix("http://")
        async with (
            running_gateway([r.url for r in replicas]) as gw,
            aiohttp.ClientSession() as session,
        ):
            await victim.kill()
            results = [await post_chat(session, gw.url, i) for i in range(30)]
            assert [status for status, _ in results] == [200] * 30
            assert victim_name not in {replica for _, replica in results}

            async def victim_marked_down() -> bool:
                _, text = await get_text(f"{gw.url}/metrics")
                healthy = metric(text, "gateway_replica_healthy", replica=victim_name)
                status, ready = await get_text(f"{gw.url}/ready")
                return healthy == 0.0 and status == 200 and '"small":2' in ready

            assert await eventually(victim_marked_down)

            port = int(victim_name.rsplit(":", 1)[1])
            revived = ManagedProcess(sim_replica_argv(port, MODEL), victim.url, name="revived")
            await revived.start()
            replicas[0] = revived  # running_sims stops whatever the list holds at the end

            async def victim_healthy_again() -> bool:
                _, text = await get_text(f"{gw.url}/metrics")
                return metric(text, "gateway_replica_healthy", replica=victim_name) == 1.0

            assert await eventually(victim_healthy_again)
            again = Counter(
                replica
                for _, replica in [await post_chat(session, gw.url, i) for i in range(100, 130)]
            )
            assert again[victim_name] > 0


async def test_a_5xx_before_the_first_byte_is_retried_on_another_replica() -> None:
    failures = 0

    async def broken(request: web.Request) -> web.Response:
        nonlocal failures
        failures += 1
        return web.json_response({"error": {"message": "boom"}}, status=500)

    async with running_sims(1) as [good]:
        async with fake_replica(broken) as bad_url, running_gateway([bad_url, good.url]) as gw:
            async with aiohttp.ClientSession() as session:
                statuses = [
                    status for status, _ in [await post_chat(session, gw.url, i) for i in range(12)]
                ]
            _, text = await get_text(f"{gw.url}/metrics")
        assert statuses == [200] * 12
        assert failures > 0
        assert metric(text, "gateway_retries_total", pool="small") == failures


def streams(*reads: bytes) -> tuple[Handler, list[web.Request]]:
    """A replica's chat handler answering a stream of ``reads``, each written apart, and the
    requests it was sent."""
    seen: list[web.Request] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for read in reads:
            await response.write(read)
        return response

    return handler, seen


VLLM_STREAM_ERROR = b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n'
"""How vLLM fails a stream it has started (a request the engine finished with an error): a
200 whose first event is the error, or whose first is the role chunk and the second the
error, where a request not streamed gets a 500."""
ROLE_CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'


@pytest.mark.parametrize("opening", [b"", ROLE_CHUNK], ids=["error first", "after the role"])
async def test_a_stream_that_opens_with_vllms_error_event_is_retried_on_another_replica(
    opening: bytes,
) -> None:
    # The role chunk a read of its own, as vLLM's may be.
    failing, seen = streams(*([opening] if opening else []), VLLM_STREAM_ERROR)
    async with running_sims(1) as [good]:
        async with fake_replica(failing) as bad_url, running_gateway([bad_url, good.url]) as gw:
            sdk = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
            for i in range(8):
                stream = await sdk.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"Question {i}"}],
                    max_tokens=2,
                    stream=True,
                )
                assert [chunk async for chunk in stream]  # whole, from the good replica
            _, text = await get_text(f"{gw.url}/metrics")
        assert seen
        assert metric(text, "gateway_retries_total", pool="small") == len(seen)


VLLM_STREAM_REFUSAL = b'data: {"error": {"message": "The provided JSON schema contains features not supported by xgrammar.", "type": "BadRequestError", "param": null, "code": 400}}\n\ndata: [DONE]\n\n'
"""vLLM refusing a request it has started to stream (its grammar backend cannot compile the
schema): the error event's code says the request is at fault."""


async def test_vllms_4xx_error_event_is_that_4xx_not_retried_nor_ejecting() -> None:
    # The event split over two reads.
    refusing, seen = streams(ROLE_CHUNK, VLLM_STREAM_REFUSAL[:60], VLLM_STREAM_REFUSAL[60:])
    async with fake_replica(refusing) as first, fake_replica(refusing) as second:
        async with running_gateway([first, second]) as gw:
            sdk = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
            for i in range(6):  # more than the failures that would eject a replica
                with pytest.raises(BadRequestError, match="not supported by xgrammar"):
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], stream=True
                    )
            _, text = await get_text(f"{gw.url}/metrics")
            _, ready = await get_text(f"{gw.url}/ready")
    assert len(seen) == 6  # one replica each: another would refuse it the same way
    assert metric(text, "gateway_requests_total", pool="small", code="400") == 6
    assert not metric(text, "gateway_retries_total", pool="small")
    assert not metric(text, "gateway_replica_ejections_total", pool="small")
    assert '"small":2' in ready


def fails_midway(event: bytes) -> Handler:
    """A replica streaming a token, then, once it is out to the client, ``event``."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(ROLE_CHUNK)
        await response.write(
            ROLE_CHUNK.replace(b'"role":"assistant","content":""', b'"content":"a"')
        )
        await asyncio.sleep(0.3)  # the tokens are out to the client: the error comes midway
        await response.write(event)
        return response

    return answer


async def test_an_error_event_later_in_a_stream_is_relayed_and_counted_as_a_failure() -> None:
    async with fake_replica(fails_midway(VLLM_STREAM_ERROR)) as url, running_gateway([url]) as gw:
        sdk = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "q"}], stream=True
        )
        with pytest.raises(APIError, match="Internal server error"):  # as vLLM's own client gets
            async for _ in stream:
                pass
        _, text = await get_text(f"{gw.url}/metrics")
    # Counted as the stream the contract calls failed, not as an answer: it was not one.
    assert metric(text, "gateway_requests_total", pool="small", code="502") == 1
    assert not metric(text, "gateway_requests_total", pool="small", code="200")


async def test_a_4xx_error_event_later_in_a_stream_is_counted_as_that_4xx() -> None:
    """The request's fault, as it would have been before the stream began: not a 502 an
    operator's alert on upstream failures would count."""
    refusing = fails_midway(VLLM_STREAM_REFUSAL)
    async with fake_replica(refusing) as url, running_gateway([url]) as gw:
        sdk = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "q"}], stream=True
        )
        with pytest.raises(APIError, match="not supported by xgrammar"):
            async for _ in stream:
                pass
        _, text = await get_text(f"{gw.url}/metrics")
    assert metric(text, "gateway_requests_total", pool="small", code="400") == 1
    assert not metric(text, "gateway_requests_total", pool="small", code="502")


async def engine_died(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "engine died", "code": "boom"}}, status=500)


@pytest.mark.parametrize(
    "env", [{"GATEWAY_RETRIES": "0"}, {}], ids=["retries off", "no other replica left"]
)
async def test_a_5xx_no_replica_is_left_to_retry_reaches_the_client_saying_where_from(
    env: dict[str, str],
) -> None:
    async with fake_replica(engine_died) as bad_url, running_gateway([bad_url], env=env) as gw:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", "q"))
            ) as response,
        ):
            assert response.status == 500
            assert (await response.json())["error"]["code"] == "boom"
            assert response.headers[headers.REPLICA] == bad_url.removeprefix("http://")
            assert response.headers[headers.ROUTE]


@pytest.mark.parametrize(
    "options",
    [None, {"include_usage": True}],
    ids=["usage asked by the gateway", "usage asked by the client"],
)
async def test_a_stream_that_breaks_ends_with_an_error_not_a_hang(
    options: ChatCompletionStreamOptionsParam | None,
) -> None:
    # It breaks mid-event: the SDK must see the error event whole, not half an event glued to
    # it (a JSON error instead of the APIError), whichever way the stream is relayed.
    async with fake_replica(breaks_mid_stream) as url, running_gateway([url]) as gw:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=10)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options=options,
        )  # fmt: skip
        received: list[str] = []
        with pytest.raises(APIError, match="mid-stream"):
            async for chunk in stream:
                received.extend(c.delta.content or "" for c in chunk.choices)
        assert received == ["partial "]


async def test_a_client_that_disconnects_mid_stream_aborts_the_request_on_the_replica() -> None:
    async with running_sims(1, decode_step_s=0.05) as [replica]:
        async with running_gateway([replica.url]) as gw:
            body = orjson.dumps(
                chat("s " * 50, "tell me a long story", max_tokens=400, stream=True)
            )
            async with aiohttp.ClientSession() as session:
                response = await session.post(f"{gw.url}/v1/chat/completions", data=body)
                await response.content.readline()  # the stream has started
                _, text = await get_text(f"{replica.url}/metrics")
                assert metric(text, "vllm:num_requests_running") == 1.0
                response.close()  # 400 tokens x 50 ms = 20 s left; the client leaves now

            async def replica_aborted() -> bool:
                _, text = await get_text(f"{replica.url}/metrics")
                return (
                    metric(text, "vllm:num_requests_running") == 0.0
                    and metric(text, "sim_requests_aborted_total") == 1.0
                )

            assert await eventually(replica_aborted, within_s=5)


async def test_a_client_that_leaves_during_prefill_frees_its_slot() -> None:
    """Before the first byte, too: the in-flight count comes down and the replica aborts."""
    async with running_sims(1, prefill_s_per_token=0.01) as [replica]:
        async with running_gateway([replica.url]) as gw:
            body = orjson.dumps(chat("long document " * 300, "summarise", max_tokens=4))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
                with pytest.raises(TimeoutError):
                    async with session.post(f"{gw.url}/v1/chat/completions", data=body) as response:
                        await response.read()  # ~10 s of prefill: the client gives up first

            async def nothing_in_flight() -> bool:
                _, gateway_text = await get_text(f"{gw.url}/metrics")
                _, replica_text = await get_text(f"{replica.url}/metrics")
                return (
                    metric(gateway_text, "gateway_replica_inflight") == 0.0
                    and metric(replica_text, "vllm:num_requests_running") == 0.0
                    and metric(replica_text, "sim_requests_aborted_total") == 1.0
                )

            assert await eventually(nothing_in_flight, within_s=5)
