"""The simulated replica speaks the rest of vLLM's OpenAI server: n > 1, batches of prompts,
continuous usage stats, /v1/responses (stored, streamed, incomplete when cut), /v1/embeddings,
/v1/score, /v1/rerank and LoRA adapters, in vLLM's shapes, read back with the official openai client where it has a method."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import pytest_asyncio

from tests.conftest import MODEL, in_process_sims

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADAPTERS = "sql-lora=/adapters/sql tone-lora"
FAST: dict[str, Any] = {"prefill_s_per_token": 0.0, "decode_step_s": 0.0, "decode_s_per_seq": 0.0}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sim() -> AsyncIterator[str]:
    async with in_process_sims(1, lora_modules=ADAPTERS, **FAST) as urls:
        yield urls[0]


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


async def test_n_choices_each_have_their_own_text_and_index(sim: str) -> None:
    reply = await client(sim).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "name three ports"}], n=3, max_tokens=8
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) == 3
    assert reply.usage is not None and reply.usage.completion_tokens == 24


async def test_streamed_n_choices_equal_the_whole_ones(sim: str) -> None:
    openai_ = client(sim)
    whole = await openai_.completions.create(model=MODEL, prompt="harbour", n=2, max_tokens=6)
    stream = await openai_.completions.create(
        model=MODEL, prompt="harbour", n=2, max_tokens=6, stream=True
    )
    texts = ["", ""]
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in whole.choices]


async def test_a_batch_of_prompts_gets_a_choice_per_prompt(sim: str) -> None:
    openai_ = client(sim)
    batch = await openai_.completions.create(
        model=MODEL, prompt=["first prompt", "second prompt"], max_tokens=5
    )
    one = await openai_.completions.create(model=MODEL, prompt="second prompt", max_tokens=5)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[1].text == one.choices[0].text
    assert batch.usage is not None and batch.usage.completion_tokens == 10
    tokens = await openai_.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2)
    assert len(tokens.choices) == 2


async def test_responses_store_a_conversation_for_previous_response_id(sim: str) -> None:
    openai_ = client(sim)
    first = await openai_.responses.create(
        model=MODEL, instructions="Be brief.", input="Where is my parcel?", max_output_tokens=6
    )
    # Cut by max_output_tokens: vLLM says incomplete, and still stores it.
    assert first.id.startswith("resp_") and first.status == "incomplete"
    assert first.incomplete_details is not None
    assert first.incomplete_details.reason == "max_output_tokens"
    assert first.output_text and first.usage is not None and first.usage.output_tokens == 6
    follow = await openai_.responses.create(
        model=MODEL, input="And when?", previous_response_id=first.id, max_output_tokens=4
    )
    assert follow.previous_response_id == first.id
    # The stored turns are prefilled again, from the cache.
    assert follow.usage is not None and follow.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError) as info:
        await openai_.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
    assert "resp_nope" in info.value.message


async def test_streamed_response_events_carry_the_same_text(sim: str) -> None:
    openai_ = client(sim)
    whole = await openai_.responses.create(model=MODEL, input="Tell me.", max_output_tokens=8)
    stream = await openai_.responses.create(
        model=MODEL, input="Tell me.", max_output_tokens=8, stream=True
    )
    kinds, deltas, completed = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "".join(deltas) == whole.output_text
    assert completed is not None and completed.output_text == whole.output_text
    assert completed.status == whole.status == "incomplete"
    assert completed.incomplete_details == whole.incomplete_details


async def test_a_response_not_cut_by_max_output_tokens_is_completed(sim: str) -> None:
    # The sim's default length stands for the model ending its answer.
    made = await client(sim).responses.create(model=MODEL, input="Tell me.")
    assert made.status == "completed" and made.incomplete_details is None


async def test_continuous_usage_stats_put_each_choices_usage_on_every_chunk(sim: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ]
    for path, body in bodies:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{sim}{path}", json={**body, "model": MODEL, "max_tokens": 2, "n": 2,
                                               "stream": True, "stream_options": options}) as got,
        ):  # fmt: skip
            events = (await got.read()).split(b"\n\n")
        chunks = [orjson.loads(e[6:]) for e in events if e.startswith(b"data: {")]
        *choice_chunks, last = chunks
        prompt = last["usage"]["prompt_tokens"]
        running: dict[int, list[int]] = {0: [], 1: []}
        for chunk in choice_chunks:
            usage = chunk["usage"]
            assert usage["total_tokens"] == prompt + usage["completion_tokens"]
            assert usage["prompt_tokens"] == prompt
            assert ("completion_tokens_details" in usage) == (path == "/v1/chat/completions")
            running[chunk["choices"][0]["index"]].append(usage["completion_tokens"])
        # Chat's role chunk counts none yet; each choice's count grows with its tokens.
        counted = [0, 1, 2] if path == "/v1/chat/completions" else [1, 2]
        assert running == {0: counted, 1: counted}, path
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
        assert last["usage"]["prompt_tokens_details"] is not None


async def test_embeddings_as_floats_and_base64(sim: str) -> None:
    openai_ = client(sim)
    # The SDK asks for base64 by default and decodes it.
    packed = await openai_.embeddings.create(model=MODEL, input=["a ship", "a port"])
    plain = await openai_.embeddings.create(
        model=MODEL, input=["a ship", "a port"], encoding_format="float"
    )
    assert [d.index for d in plain.data] == [0, 1]
    assert len(plain.data[0].embedding) == 32
    assert packed.data[0].embedding == pytest.approx(plain.data[0].embedding, rel=1e-6)
    assert plain.data[0].embedding != plain.data[1].embedding
    assert plain.usage.prompt_tokens > 0


async def test_score_and_rerank_in_vllms_shapes(sim: str) -> None:
    status, score = await post(
        f"{sim}/v1/score", {"model": MODEL, "text_1": "ships", "text_2": ["ships", "cats"]}
    )
    assert status == 200 and score["object"] == "list"
    assert [d["index"] for d in score["data"]] == [0, 1]
    assert score["data"][0]["score"] == pytest.approx(1.0)
    status, rerank = await post(
        f"{sim}/v1/rerank",
        {"model": MODEL, "query": "ships", "documents": ["cats", "ships", "dogs"], "top_n": 2},
    )
    assert status == 200 and len(rerank["results"]) == 2
    best = rerank["results"][0]
    assert best["index"] == 1 and best["document"]["text"] == "ships"
    assert rerank["usage"]["total_tokens"] > 0
    status, error = await post(f"{sim}/v1/rerank", {"model": MODEL, "documents": ["a"]})
    assert status == 400 and error["error"]["param"] == "query"


async def test_lora_adapters_are_listed_and_served_with_their_own_cache(sim: str) -> None:
    openai_ = client(sim)
    models = {m.id: m for m in (await openai_.models.list()).data}
    assert set(models) == {MODEL, "sql-lora", "tone-lora"}
    assert models["sql-lora"].model_extra == {
        "root": "/adapters/sql", "parent": MODEL, "max_model_len": None
    }  # fmt: skip
    prompt = "A long shared opening about the harbour master's schedule. " * 10
    base = await openai_.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    lora = await openai_.completions.create(model="sql-lora", prompt=prompt, max_tokens=4)
    again = await openai_.completions.create(model="sql-lora", prompt=prompt, max_tokens=4)
    assert lora.model == "sql-lora" and lora.choices[0].text != base.choices[0].text
    # The base model's blocks are not the adapter's: its first request prefills from scratch.
    assert lora.usage is not None and lora.usage.prompt_tokens_details is not None
    assert lora.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) > 0
    with pytest.raises(openai.NotFoundError):
        await openai_.completions.create(model="other-lora", prompt="x", max_tokens=1)


async def test_a_stored_response_can_be_retrieved_not_cancelled(sim: str) -> None:
    openai_ = client(sim)
    made = await openai_.responses.create(model=MODEL, input="Keep this.", max_output_tokens=3)
    got = await openai_.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    with pytest.raises(openai.BadRequestError):
        await openai_.responses.cancel(made.id)
    with pytest.raises(openai.NotFoundError):
        await openai_.responses.retrieve("resp_never")
