"""Behind Envoy, the bodies the picker reads and sends and what it counts: a body is read per
its Content-Encoding as `serve` reads it, a tiered request reaches its pool's model, Envoy's
failovers are retries, Envoy's own answers (its 413, its 503 when no replica could be reached)
are in the OpenAI shape, every answer carries the request's id, and none names the replica's
address. Real processes: simulated replicas, the picker, Envoy."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any, cast

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from gateway.headers import REQUEST_ID
from gateway.picker.envoy_config import SERVED
from tests.conftest import (
    MODEL,
    Handler,
    answered,
    chat,
    eventually,
    fake_replica,
    get_text,
    gzips_its_stream,
    metric,
)
from tests.picker import SYSTEM, Unavailable, behind_envoy, client, tiers_behind_envoy
from tests.tiers import EASY, HARD

pytestmark = pytest.mark.envoy

CHAT = "/v1/chat/completions"


class Recording:
    """A replica's completions handler that answers a chat completion, keeping what it got."""

    def __init__(self) -> None:
        self.encodings: list[str | None] = []
        self.bodies: list[bytes] = []

    async def __call__(self, request: web.Request) -> web.Response:
        self.encodings.append(request.headers.get("Content-Encoding"))
        self.bodies.append(await request.read())
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.json_response(answer)


async def test_a_gzip_body_is_read_as_serve_reads_it_and_the_replica_gets_it_decoded() -> None:
    recording = Recording()
    body = orjson.dumps(chat(SYSTEM, "compressed", max_tokens=2))
    gzipped = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with (
        fake_replica(recording) as replica,
        behind_envoy(0, more=[replica]) as (_, envoy, _),
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        url = f"{envoy.listen_url}{CHAT}"
        async with session.post(url, data=gzip.compress(body), headers=gzipped) as answer:
            assert answer.status == 200
        assert recording.encodings == [None]  # vLLM does not decode: it gets the JSON itself
        assert orjson.loads(recording.bodies[0]) == orjson.loads(body)

        async with session.post(url, data=body, headers=gzipped) as answer:
            assert answer.status == 400
            assert (await answer.json())["error"]["code"] == "invalid_content_encoding"
        assert len(recording.bodies) == 1  # not routed


async def test_a_request_envoy_moves_to_a_fallback_is_counted_as_a_retry() -> None:
    unavailable = Unavailable()
    async with (
        fake_replica(unavailable) as broken,
        behind_envoy(1, more=[broken]) as (picker, envoy, _),
    ):
        for i in range(6):
            await client(envoy).chat.completions.create(
                **chat(f"Conversation {i}. " + SYSTEM, "hello", max_tokens=2)
            )
        _, exposition = await get_text(f"{picker.url}/metrics")
    assert unavailable.tried >= 1
    assert metric(exposition, "gateway_retries_total", pool="small") == unavailable.tried


async def test_a_body_over_the_limit_is_refused_by_envoy_in_the_openai_shape() -> None:
    too_big = orjson.dumps(chat(SYSTEM, "x" * (5 * 1024 * 1024), max_tokens=2))
    async with behind_envoy(1) as (_, envoy, _), aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/json", REQUEST_ID: "too-big-1"}
        async with session.post(f"{envoy.listen_url}{CHAT}", data=too_big, headers=headers) as a:
            assert a.status == 413
            assert a.content_type == "application/json"
            assert a.headers[REQUEST_ID] == "too-big-1"
            error = (await a.json())["error"]
    assert error["code"] == "request_too_large"
    assert error["type"] == "invalid_request_error"


async def resets(request: web.Request) -> web.Response:
    """A replica's completions handler that drops the connection before any answer (its health
    checks pass): Envoy retries, then gives up with its own 503."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def test_when_no_replica_can_be_reached_envoys_503_is_in_the_openai_shape() -> None:
    """Through the picker, and with the picker away (Envoy fails open, and answers alone)."""
    async with (
        fake_replica(resets) as replica,
        behind_envoy(0, more=[replica]) as (picker, envoy, _),
        aiohttp.ClientSession() as session,
    ):
        url, body = f"{envoy.listen_url}{CHAT}", chat(SYSTEM, "hello", max_tokens=2)

        async def refused(own_id: str) -> dict[str, Any]:
            async with session.post(url, json=body, headers={REQUEST_ID: own_id}) as a:
                assert a.status == 503
                assert a.content_type == "application/json"
                assert a.headers[REQUEST_ID] == own_id
                return cast(dict[str, Any], (await a.json())["error"])

        answered = [await refused("through-the-picker")]
        await picker.kill()
        answered.append(await refused("picker-away"))
    for error in answered:
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "service_unavailable_error"
        assert error["code"] == "upstream_unavailable"
        assert error["message"].startswith("No replica could serve the request")


async def test_envoy_tries_no_replica_twice_as_serve_retries_none_it_tried() -> None:
    """A pool of one names its replica for every try Envoy may make (past the list, Envoy's
    fallback picks from every pool), yet a replica failing before its first byte is tried
    once: three tries were three times its load."""
    tried: list[int] = []

    async def counts_and_resets(request: web.Request) -> web.Response:
        tried.append(1)
        return await resets(request)

    async with (
        fake_replica(counts_and_resets) as replica,
        behind_envoy(0, more=[replica]) as (_, envoy, _),
        aiohttp.ClientSession() as session,
    ):
        url, body = f"{envoy.listen_url}{CHAT}", chat(SYSTEM, "hello", max_tokens=2)
        async with session.post(url, json=body) as answer:
            assert answer.status == 503
    assert len(tried) == 1


async def test_an_answer_the_picker_lets_through_carries_the_request_id() -> None:
    """As `serve`'s: the client's own id where it sent one, else one made for the request."""
    async with behind_envoy(1) as (_, envoy, _), aiohttp.ClientSession() as session:
        url = f"{envoy.listen_url}/v1/models"
        async with session.get(url, headers={REQUEST_ID: "list-models-1"}) as listed:
            assert listed.status == 200
            assert listed.headers[REQUEST_ID] == "list-models-1"
            # The rest of the answer goes on after the picker has set its headers: whole.
            assert [card["id"] for card in (await listed.json())["data"]] == [MODEL]
        async with session.get(url) as listed, session.get(url) as again:
            made = {listed.headers[REQUEST_ID], again.headers[REQUEST_ID]}
        assert len(made) == 2 and all(made)


async def test_a_tiered_request_reaches_its_pool_naming_the_pools_model() -> None:
    """The tier `auto` is no model a replica knows: whether the picker asks for a stream's
    usage or the request goes as the client wrote it, the replica gets its pool's model."""
    async with tiers_behind_envoy() as envoy:
        sdk = client(envoy)
        for text, model in ((EASY, "small-model"), (HARD, "large-model")):
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
            whole = await sdk.chat.completions.create(model="auto", messages=messages, max_tokens=2)
            assert whole.model == model
            stream = await sdk.chat.completions.create(
                model="auto",
                messages=messages,
                max_tokens=2,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert {chunk.model for chunk in chunks} == {model}
            assert chunks[-1].usage is not None


async def test_no_answer_names_the_replica_that_served_it() -> None:
    """Not one the picker lets through untouched (a GET), nor any while it is away."""
    async with behind_envoy(1) as (picker, envoy, _), aiohttp.ClientSession() as session:
        async with session.get(f"{envoy.listen_url}/v1/models") as listed:
            assert listed.status == 200
            assert SERVED not in listed.headers
        await picker.kill()
        raw = await client(envoy).chat.completions.with_raw_response.create(
            **chat(SYSTEM, "hello", max_tokens=2)
        )
        assert SERVED not in raw.headers


def streams_then(last: bytes) -> Handler:
    """A replica's chat handler: one chunk of a stream, then ``last``, then a clean end."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                 "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}  # fmt: skip
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n" + last)
        return response

    return handler


FAILED_STREAMS = {
    "closed before data: [DONE]": b"",
    "vLLM's error event": b'data: {"error":{"message":"engine died","code":500}}\n\ndata: [DONE]\n\n',
}


@pytest.mark.parametrize("last", FAILED_STREAMS.values(), ids=FAILED_STREAMS.keys())
async def test_a_stream_its_replica_failed_after_the_first_byte_counts_502_as_in_serve(
    last: bytes,
) -> None:
    body = orjson.dumps(chat(SYSTEM, "hi", stream=True))
    async with (
        fake_replica(streams_then(last)) as replica,
        behind_envoy(0, more=[replica]) as (picker, envoy, _),
        aiohttp.ClientSession() as session,
    ):
        async with session.post(f"{envoy.listen_url}{CHAT}", data=body) as answer:
            assert answer.status == 200
            await answer.read()  # relayed as it came: Envoy closed it cleanly

        assert await eventually(lambda: answered(picker.url, "502"))
        _, exposition = await get_text(f"{picker.url}/metrics")
    assert metric(exposition, "gateway_requests_total", pool="small", code="200") is None


async def test_a_compressed_stream_goes_out_as_it_comes_not_held_for_the_usage_event() -> None:
    # The picker asks for the stream's usage: in compressed bytes it can neither be read nor
    # dropped, so nothing of the stream is held back looking for it.
    more = asyncio.Event()
    body = orjson.dumps(chat(SYSTEM, "hi", stream=True))
    async with (
        fake_replica(gzips_its_stream(more)) as replica,
        behind_envoy(0, more=[replica]) as (_, envoy, _),
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(f"{envoy.listen_url}{CHAT}", data=body) as answer,
    ):
        async with asyncio.timeout(5):
            first = await answer.content.readany()  # while the replica holds the rest
        more.set()
        await answer.read()
    assert b'"zipped "' in zlib.decompressobj(wbits=31).decompress(first)


async def test_a_compressed_stream_counts_as_the_success_it_is() -> None:
    # No end marker can be read in compressed bytes: a clean close is the end, as in serve.
    body = orjson.dumps(chat(SYSTEM, "hi", stream=True))
    async with (
        fake_replica(gzips_its_stream()) as replica,
        behind_envoy(0, more=[replica]) as (picker, envoy, _),
        aiohttp.ClientSession() as session,
    ):
        async with session.post(f"{envoy.listen_url}{CHAT}", data=body) as answer:
            assert answer.status == 200
            assert (await answer.read()).endswith(b"data: [DONE]\n\n")  # decoded by aiohttp
        assert await eventually(lambda: answered(picker.url, "200"))
        assert not await answered(picker.url, "502")
