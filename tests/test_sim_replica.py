"""The simulated replica's OpenAI/vLLM HTTP surface: chat and text completions in OpenAI
format, max-token defaults, streamed text that equals the whole answer and whose first byte waits
for the first token, cached prompt tokens in usage (until /reset_prefix_cache) and kept apart
by cache_salt, vLLM's error bodies and limits, the echoed x-request-id, /health and /v1/models."""

import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer
from openai.types.chat import ChatCompletionMessageParam

from gateway.fleet.kv_event_stream import EventStream
from replica.sim.server import ENGINE_KEY
from router_policies.engine_blocks import root_key, token_block_keys
from tests.kv_events import payload
from tests.sim import STREAM_OPTIONS_USAGE, Serve, base_url, client_for

LONG_SYSTEM_PROMPT = "You are a careful assistant for the routing gateway docs. " * 40


async def test_chat_and_completions_answer_in_openai_format(serve: Serve) -> None:
    server = await serve()
    async with client_for(server) as client:
        chat = await client.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
        )
        completion = await client.completions.create(
            model="sim-model", prompt="Once upon a time", max_tokens=3
        )

    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    assert chat.model == "sim-model"
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert choice.message.content is not None and len(choice.message.content.split()) == 5
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + 5
    assert completion.id.startswith("cmpl-") and completion.object == "text_completion"
    assert len(completion.choices[0].text.split()) == 3
    assert completion.choices[0].finish_reason == "length"


async def test_default_max_tokens_and_max_completion_tokens(serve: Serve) -> None:
    server = await serve(default_max_tokens=7)
    async with client_for(server) as client:
        default = await client.completions.create(model="sim-model", prompt="hi")
        chat = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            max_completion_tokens=4,
        )
    assert default.usage is not None and default.usage.completion_tokens == 7
    assert chat.usage is not None and chat.usage.completion_tokens == 4


async def test_streamed_text_equals_the_whole_answer(serve: Serve) -> None:
    server = await serve()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Tell me about caches."}]},
    ]
    async with client_for(server) as client:
        whole = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=12
        )
        chunks = [
            chunk
            async for chunk in await client.chat.completions.create(
                model="sim-model",
                messages=messages,
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        whole_text = await client.completions.create(
            model="sim-model", prompt="abc def", max_tokens=6
        )
        text_chunks = [
            chunk
            async for chunk in await client.completions.create(
                model="sim-model", prompt="abc def", max_tokens=6, stream=True
            )
        ]

    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1

    assert "".join(c.choices[0].text for c in text_chunks) == whole_text.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in text_chunks), "no usage chunk unless asked"


async def test_the_first_streamed_byte_waits_for_the_first_token(serve: Serve) -> None:
    server = await serve(prefill_s_per_token=0.001)  # 100 tokens: 0.1 s of prefill
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(
            base_url(server) + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "y" * 370}], "max_tokens": 2,
                  "stream": True},
        ) as response:  # fmt: skip
            first_line = await response.content.readline()
            waited = time.monotonic() - started
            rest = await response.read()
    assert waited >= 0.09, "the role chunk must not go out before the first token"
    role = orjson.loads(first_line.removeprefix(b"data: "))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_repeated_long_prompt_reports_cached_tokens(serve: Serve) -> None:
    server = await serve()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": LONG_SYSTEM_PROMPT},
        {"role": "user", "content": "What is a prefix cache?"},
    ]
    async with client_for(server) as client:
        first = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )
        second = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )
        async with aiohttp.ClientSession() as session:
            async with session.post(base_url(server) + "/reset_prefix_cache") as response:
                assert response.status == 200 and await response.json() == {"success": True}
        after_reset = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=2
        )

    def cached(response: object) -> int:
        usage = getattr(response, "usage", None)
        assert usage is not None and usage.prompt_tokens_details is not None
        return int(usage.prompt_tokens_details.cached_tokens or 0)

    assert cached(first) == 0
    assert cached(second) > 0.9 * second.usage.prompt_tokens  # type: ignore[union-attr]
    assert cached(after_reset) == 0


async def test_a_cache_salt_keeps_tenants_prefix_caches_apart_as_vllms_does(serve: Serve) -> None:
    # The reviewer's case: tenant B, salted differently, sent tenant A's prompt and was told
    # 112 of its 120 tokens were cached; vLLM mixes the salt into the first block's hash.
    server = await serve()
    prompt = [7] * 120

    async def cached(path: str, salt: str | None, body: dict[str, Any]) -> int:
        salted = {} if salt is None else {"cache_salt": salt}
        async with (
            aiohttp.ClientSession() as session,
            session.post(base_url(server) + path, json={**body, **salted}) as response,
        ):
            assert response.status == 200, await response.text()
            usage = (await response.json())["usage"]
        details = usage.get("prompt_tokens_details") or usage["input_tokens_details"]
        return int(details["cached_tokens"])

    completion = {"prompt": prompt, "max_tokens": 1}
    assert await cached("/v1/completions", "tenant-a", completion) == 0
    assert await cached("/v1/completions", "tenant-b", completion) == 0
    assert await cached("/v1/completions", None, completion) == 0
    assert await cached("/v1/completions", "tenant-a", completion) == 112
    assert await cached("/v1/completions", None, completion) == 112

    chat = {"messages": [{"role": "user", "content": LONG_SYSTEM_PROMPT}], "max_tokens": 1}
    responses = {"input": "A different document, so no chat blocks. " * 40, "max_output_tokens": 1}
    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses)):
        assert await cached(path, "tenant-a", body) == 0, path
        assert await cached(path, "tenant-b", body) == 0, path
        assert await cached(path, "tenant-a", body) > 0, path


async def test_a_salted_requests_blocks_reach_the_gateway_under_its_salt(serve: Serve) -> None:
    server = await serve()
    engine = server.app[ENGINE_KEY]
    engine.kv_cache.events = []  # no publisher configured: the events stay here to be read
    prompt = [7] * 120
    async with aiohttp.ClientSession() as session:
        for salt in ("tenant-a", "tenant-b"):
            body = {"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
            async with session.post(base_url(server) + "/v1/completions", json=body) as response:
                assert response.status == 200
    stream = EventStream("tcp://unused")  # the gateway's reading of a replica's events
    stream.apply(0, payload(*engine.kv_cache.events))
    size = engine.config.block_size
    for salt in ("tenant-a", "tenant-b"):
        assert stream.blocks.match(token_block_keys(prompt, size, root_key(None, salt))) == 7
    assert stream.blocks.match(token_block_keys(prompt, size, root_key(None, None))) == 0


@pytest.mark.parametrize("salt", ["", 5, ["a"], "a/b", "a@b", "a\\b", "a\x00b", "x" * 129])
async def test_a_cache_salt_vllm_refuses_is_refused_in_its_words(
    serve: Serve, salt: object
) -> None:
    server = await serve()
    message = (
        "Parameter 'cache_salt' must be a non-empty string if provided."
        if not isinstance(salt, str) or not salt
        else "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
        "'/', '\\\\', or NUL."
    )
    expected = {"message": f"{message} (parameter=cache_salt)", "type": "BadRequestError",
                "param": "cache_salt", "code": 400}  # fmt: skip
    hi = [{"role": "user", "content": "hi"}]
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": hi}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/embeddings", {"input": "hi"}),
        ("/v1/rerank", {"query": "hi", "documents": ["a"]}),
    ]
    for path, body in bodies:
        assert await _error(server, path, {**body, "cache_salt": salt}) == (400, expected), path
    ok = await _error(server, "/v1/completions", {"prompt": "hi", "cache_salt": "x" * 128})
    assert ok == (200, None)


async def test_errors_use_vllms_error_body(serve: Serve) -> None:
    # vLLM 0.32's body, not OpenAI's: type names the exception, code repeats the status.
    server = await serve(max_model_len=64)
    async with client_for(server) as client:
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.chat.completions.create(
                model="gpt-4", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="sim-model", prompt="x" * 1000)
    assert not_found.value.body == {
        "message": "The model `gpt-4` does not exist. Valid aliases: sim-model.",
        "type": "NotFoundError", "param": "model", "code": 404,
    }  # fmt: skip
    assert too_long.value.body == {
        "message": "This model's maximum context length is 64 tokens. However, your prompt "
        "contains at least 65 input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        "value=65)",
        "type": "BadRequestError", "param": "input_tokens", "code": 400,
    }  # fmt: skip

    url = base_url(server)
    async with aiohttp.ClientSession() as session:
        for path, body in [
            ("/v1/chat/completions", b"{not json"),
            ("/v1/chat/completions", b'{"model": "sim-model"}'),
            ("/v1/chat/completions", b'{"messages": []}'),
            ("/v1/completions", b'{"model": "sim-model"}'),
            ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}'),
        ]:
            async with session.post(url + path, data=body) as response:
                assert response.status == 400, body
                error = orjson.loads(await response.read())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "BadRequestError" and error["code"] == 400, body
                assert error["message"]


async def _error(server: TestServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(base_url(server) + path, json=body) as response,
    ):
        return response.status, (await response.json()).get("error")


async def test_the_limits_vllm_checks_are_refused_in_its_words(serve: Serve) -> None:
    server = await serve(max_model_len=64)
    hi = [{"role": "user", "content": "hi"}]
    assert await _error(server, "/v1/chat/completions", {"messages": hi, "max_tokens": 65}) == (
        400,
        {
            "message": "max_tokens=65 cannot be greater than max_model_len=64. Please request "
            "fewer output tokens. (parameter=max_tokens, value=65)",
            "type": "BadRequestError", "param": "max_tokens", "code": 400,
        },
    )  # fmt: skip
    assert await _error(server, "/v1/completions", {"prompt": "hi", "temperature": -1}) == (
        400,
        {
            "message": "temperature must be non-negative, got -1.0. "
            "(parameter=temperature, value=-1.0)",
            "type": "BadRequestError", "param": "temperature", "code": 400,
        },
    )  # fmt: skip
    status, error = await _error(
        server, "/v1/chat/completions", {"messages": hi, "temperature": -0.5}
    )
    assert status == 400 and error["param"] == "temperature"
    for body, param in [
        ({"max_output_tokens": 65}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
    ]:
        status, error = await _error(server, "/v1/responses", {"input": "hi", **body})
        assert (status, error["param"], error["type"]) == (400, param, "BadRequestError")
    asked: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": hi}),
        ("/v1/completions", {"prompt": "hi"}),
    ]
    for path, prompt in asked:
        usage = {**prompt, "stream_options": {"include_usage": True}}
        status, error = await _error(server, path, usage)
        assert (status, error["param"]) == (400, "stream_options"), path
        assert error["message"] == "Stream options can only be defined when `stream=True`."
    # A prompt that fills the whole context leaves max_tokens nothing.
    status, error = await _error(server, "/v1/completions", {"prompt": [7] * 64})
    assert status == 400 and error["message"] == (
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )


async def test_max_tokens_past_the_context_is_clamped_as_vllm_does(serve: Serve) -> None:
    # vLLM refuses only max_tokens over max_model_len; prompt + max_tokens over it just
    # shortens the output to what the context has room for, per prompt of a batch.
    server = await serve(max_model_len=64)
    async with client_for(server) as client:
        one = await client.completions.create(model="sim-model", prompt=[7] * 60, max_tokens=64)
        batch = await client.completions.create(
            model="sim-model", prompt=[[7] * 60, [8] * 50], max_tokens=20
        )
    assert one.choices[0].finish_reason == "length"
    assert one.usage is not None and one.usage.completion_tokens == 4
    assert [len(c.text.split()) for c in batch.choices] == [4, 14]


async def test_request_id_is_echoed(serve: Serve) -> None:
    server = await serve()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            base_url(server) + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            headers={"x-request-id": "req-42"},
        ) as response:
            assert response.headers["x-request-id"] == "req-42"
            assert (await response.json())["id"] == "chatcmpl-req-42"
        async with session.post(
            base_url(server) + "/v1/completions", json={"prompt": "hi", "model": "nope"},
            headers={"x-request-id": "req-43"},
        ) as response:  # fmt: skip
            assert response.status == 404
            assert response.headers["x-request-id"] == "req-43"


async def test_health_and_models(serve: Serve) -> None:
    server = await serve(model="llama-8b", max_model_len=4096)
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url(server) + "/health") as response:
            assert response.status == 200 and await response.read() == b""
    async with client_for(server) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == ["llama-8b"]
    assert models.data[0].model_extra == {
        "root": "llama-8b", "parent": None, "max_model_len": 4096
    }  # fmt: skip


async def test_a_null_stream_is_no_stream_as_in_vllm(serve: Serve) -> None:
    server = await serve()
    prompts: list[tuple[str, dict[str, object]]] = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ]
    async with aiohttp.ClientSession() as session:
        for path, prompt in prompts:
            body = {**prompt, "stream": None, "max_tokens": 2}
            async with session.post(base_url(server) + path, json=body) as response:
                assert response.status == 200, await response.text()
                assert response.content_type == "application/json"
                assert (await response.json())["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(("options", "usage"), STREAM_OPTIONS_USAGE)
async def test_a_stream_ends_with_its_usage_when_vllm_would_send_it(
    serve: Serve, options: dict[str, object] | None, usage: bool
) -> None:
    server = await serve()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
            "stream_options": options}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(base_url(server) + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        events = (await response.read()).split(b"\n\n")
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events if e.startswith(b"data: {")]
    assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [2] * usage
