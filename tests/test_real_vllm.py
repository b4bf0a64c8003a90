"""End to end against two real vLLM replicas on the CPU, through the real gateway process: the
OpenAI surface as a client sees it (chat and completions, streamed text equal to unstreamed,
batched prompts, the Responses API with its follow-ups kept on the replica that stored them,
tokenize and detokenize) and a client hanging up mid-stream freeing the engine. Needs
replica/vllm_cpu/install.sh and the tiny model (see replica/vllm_cpu/README.md); skipped with
the reason otherwise. Run with ``pytest -m vllm -rs``; the default run deselects it.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson
import pytest

from gateway import headers
from gateway.http.request_body import Endpoint, parse_request
from gateway.relay.stream_usage import asking_usage
from tests.real_vllm import POOL, SERVED, RealFleet, engine_value, long_system_prompt, wait_for

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="session"),  # the one fleet of tests/real_vllm.py
    # The first test also pays for the fixture: two replicas take 20-60 s to start.
    pytest.mark.timeout(360),
]


async def test_openai_chat_streamed_text_equals_unstreamed(fleet: RealFleet) -> None:
    request: dict[str, Any] = {
        "model": SERVED,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours."},
        ],
        "max_tokens": 24,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},  # a random model may end at once; fix the length
    }
    async with fleet.client() as client:
        whole = await client.chat.completions.create(**request)
        stream = await client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        parts: list[str] = []
        usage = None
        async for chunk in stream:
            parts.extend(choice.delta.content or "" for choice in chunk.choices)
            usage = chunk.usage or usage
    text = whole.choices[0].message.content
    assert text and "".join(parts) == text
    assert whole.model == SERVED
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    assert usage is not None and usage.completion_tokens == 24
    assert usage.prompt_tokens == whole.usage.prompt_tokens


async def test_openai_completions_streamed_text_equals_unstreamed(fleet: RealFleet) -> None:
    request: dict[str, Any] = {
        "model": SERVED,
        "prompt": "Once upon a time, in a land of tiny models,",
        "max_tokens": 32,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    async with fleet.client() as client:
        whole = await client.completions.create(**request)
        stream = await client.completions.create(**request, stream=True)
        chunks = [chunk async for chunk in stream]
    parts = [choice.text for chunk in chunks for choice in chunk.choices]
    assert whole.choices[0].text and "".join(parts) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 32
    # The gateway asked vLLM for this stream's usage, which the client did not: never shown.
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)


async def stream_events(url: str, body: dict[str, Any] | bytes) -> list[dict[str, Any]]:
    """The JSON events of a chat stream, as a client reads them raw (the SDKs hide a field)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    json = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=data, headers=json) as response,
    ):
        raw = await response.read()
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n") if line]
    return [orjson.loads(event) for event in events if event != b"[DONE]"]


async def test_a_stream_whose_usage_the_gateway_asked_for_comes_as_the_client_asked(
    fleet: RealFleet,
) -> None:
    # The gateway asks vLLM for the usage the client did not: vLLM then sends a usage event
    # (some servers also put "usage": null on every other chunk). The client gets neither.
    body = {
        "model": SERVED, "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 8, "temperature": 0, "stream": True, "ignore_eos": True,
    }  # fmt: skip
    through = await stream_events(f"{fleet.gateway}/v1/chat/completions", body)
    direct = await stream_events(f"{next(iter(fleet.replicas.values()))}/v1/chat/completions", body)

    # vLLM merges the tokens of a step into one chunk as its client keeps up: compare their
    # shapes, not their number. Asked for the usage, vLLM sends the system_fingerprint on the
    # usage event, dropped with it (docs/operations.md, GATEWAY_STREAM_USAGE).
    def shapes(events: list[dict[str, Any]]) -> set[tuple[str, ...]]:
        return {tuple(sorted(set(event) - {"system_fingerprint"})) for event in events}

    assert shapes(through) == shapes(direct)
    assert not any("usage" in event for event in through)


async def test_client_disconnect_mid_stream_frees_the_engine(fleet: RealFleet) -> None:
    tokens_before = {
        url: await engine_value(url, "vllm:generation_tokens_total")
        for url in fleet.replicas.values()
    }
    async with fleet.client() as client:
        async with client.completions.with_streaming_response.create(
            model=SERVED,
            prompt="Tell me a very long story.",
            max_tokens=1800,  # ~10 s of decoding on one core: far from done when we hang up
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as response:
            url = fleet.replicas[response.headers[headers.REPLICA]]
            chunks = 0
            async for chunk in await response.parse():
                chunks += len(chunk.choices)
                if chunks >= 5:
                    break

            async def running() -> float:
                return await engine_value(url, "vllm:num_requests_running")

            assert await wait_for(running, lambda v: v == 1.0, timeout_s=5.0) == 1.0
        # Leaving the block closes the connection mid-stream.
    hung_up = time.monotonic()
    assert await wait_for(running, lambda v: v == 0.0, timeout_s=8.0) == 0.0
    assert time.monotonic() - hung_up < 8.0
    # Stopped, not run to its 1,800 tokens (vLLM 0.32 does not count client aborts in
    # vllm:request_success_total{finished_reason="abort"}, so the token counter tells).
    generated = await engine_value(url, "vllm:generation_tokens_total") - tokens_before[url]
    assert 5 <= generated < 900, generated


async def post_json(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, dict(response.headers), await response.json()


async def test_tokenize_and_detokenize_through_the_gateway(fleet: RealFleet) -> None:
    text = "the red thing matters most"
    status, hdrs, tokens = await post_json(
        f"{fleet.gateway}/tokenize", {"model": SERVED, "prompt": text}
    )
    assert status == 200, tokens
    assert hdrs[headers.POOL] == POOL and hdrs[headers.REPLICA] in fleet.replicas
    assert tokens["count"] == len(tokens["tokens"]) > 0
    direct = await post_json(
        f"{fleet.replicas[hdrs[headers.REPLICA]]}/tokenize", {"model": SERVED, "prompt": text}
    )
    assert direct[2]["tokens"] == tokens["tokens"]
    # vLLM serves its one model when none is named; so does the gateway with one pool.
    status, _, back = await post_json(
        f"{fleet.gateway}/detokenize", {"tokens": tokens["tokens"][1:]}
    )
    assert status == 200 and back["prompt"].strip() == text


async def test_completions_with_a_batch_of_prompts(fleet: RealFleet) -> None:
    prompts = ["Once upon a time,", "In a land of tiny models,", "The end."]
    async with fleet.client() as client:
        batch = await client.completions.create(
            model=SERVED, prompt=prompts, max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        alone = await client.completions.create(
            model=SERVED, prompt=prompts[1], max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    assert sorted(c.index for c in batch.choices) == [0, 1, 2]
    second = next(c for c in batch.choices if c.index == 1)
    assert second.text == alone.choices[0].text
    assert batch.usage is not None and batch.usage.completion_tokens == 18


async def test_responses_streamed_and_followed_up_on_the_same_replica(fleet: RealFleet) -> None:
    instructions = long_system_prompt(10)
    async with fleet.client() as client:
        raw = await client.responses.with_raw_response.create(
            model=SERVED, instructions=instructions, input="Name a colour.",
            max_output_tokens=8, temperature=0,
        )  # fmt: skip
        first = raw.parse()
        assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
        assert first.usage is not None and first.usage.input_tokens > 0
        stream = await client.responses.create(
            model=SERVED, instructions=instructions, input="Name a colour.",
            max_output_tokens=8, temperature=0, stream=True,
        )  # fmt: skip
        kinds, completed = [], None
        async for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                completed = event.response
        assert kinds[0] == "response.created" and completed is not None
        assert completed.output_text == first.output_text
        got = await client.responses.with_raw_response.retrieve(first.id)
        assert got.parse().output_text == first.output_text
        assert got.headers[headers.REPLICA] == raw.headers[headers.REPLICA]
        # The stored response lives in one replica's memory: the follow-up must go there.
        for previous, replica in ((first.id, raw.headers[headers.REPLICA]), (completed.id, None)):
            follow = await client.responses.with_raw_response.create(
                model=SERVED, input="Another one.", previous_response_id=previous,
                max_output_tokens=4, temperature=0,
            )  # fmt: skip
            assert follow.parse().previous_response_id == previous
            if replica is not None:
                assert follow.headers[headers.REPLICA] == replica


async def test_vllm_reads_the_stream_options_the_gateway_adds_after_the_clients_own(
    fleet: RealFleet,
) -> None:
    # The gateway appends its stream_options to the client's body, bytes untouched: vLLM must
    # take the last of the two ("false" is pydantic's false, so the gateway asks).
    sent = {
        "model": SERVED, "prompt": "Once upon a time,", "max_tokens": 4, "temperature": 0,
        "stream": True, "ignore_eos": True, "stream_options": {"include_usage": "false"},
    }  # fmt: skip
    asked = asking_usage(parse_request(Endpoint.COMPLETIONS, orjson.dumps(sent), 64))
    assert asked is not None and asked.count(b'"stream_options"') == 2
    events = await stream_events(f"{next(iter(fleet.replicas.values()))}/v1/completions", asked)
    assert events[-1]["usage"]["completion_tokens"] == 4
