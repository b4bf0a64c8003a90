"""Behind Envoy, the bodies the picker reads and sends and what it counts: a body is read per
its Content-Encoding as `serve` reads it, a tiered request reaches its pool's model, Envoy's
failovers are retries, Envoy's own 413 is in the OpenAI shape, and no answer names the replica's
address. Real processes: simulated replicas, the picker, Envoy."""

from __future__ import annotations

import gzip

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from gateway.picker.envoy_config import SERVED
from tests.conftest import MODEL, chat, fake_replica, get_text, metric
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
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{envoy.listen_url}{CHAT}", data=too_big, headers=headers) as a:
            assert a.status == 413
            assert a.content_type == "application/json"
            error = (await a.json())["error"]
    assert error["code"] == "request_too_large"
    assert error["type"] == "invalid_request_error"


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
