"""The gateway through the official OpenAI client: the API clients already use, unchanged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import BadRequestError, NotFoundError
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from gateway import headers
from gateway.telemetry.metrics import NO_POOL
from replica.processes import ManagedProcess
from tests.conftest import (
    MODEL,
    admin_route,
    eventually,
    learned_chars_per_token,
    metric_sum,
    official_client,
    running_gateway,
    running_sims,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are a terse assistant for a shipping company. " * 20
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Where is my parcel?"},
]


ADAPTER = "sql-lora"
"""Declared in the policy."""
LEARNED = "tone-lora"
"""Served by the replicas only: learned from their /v1/models."""

ADMIN_TOKEN = "test-admin-token"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas() -> AsyncIterator[list[ManagedProcess]]:
    async with running_sims(
        2, decode_step_s=0.002, lora_modules=f"{ADAPTER}=/lora/sql {LEARNED}"
    ) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(replicas: list[ManagedProcess]) -> AsyncIterator[ManagedProcess]:
    env = {"GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    async with running_gateway([r.url for r in replicas], adapters=[ADAPTER], env=env) as gw:
        yield gw


async def test_models_lists_every_pools_model_and_its_adapters(gateway: ManagedProcess) -> None:
    models = await official_client(gateway.url).models.list()
    ids = [m.id for m in models.data]
    assert ids[:2] == [MODEL, ADAPTER] and set(ids[2:]) <= {LEARNED}
    base, adapter = models.data[:2]
    assert base.owned_by == "vllm" and base.model_extra == {"root": MODEL, "parent": None}
    assert adapter.model_extra == {"root": ADAPTER, "parent": MODEL}


async def test_models_retrieve_names_one_model_or_404(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    assert (await openai.models.retrieve(MODEL)).id == MODEL
    adapter = await openai.models.retrieve(ADAPTER)
    assert adapter.model_extra == {"root": ADAPTER, "parent": MODEL}
    with pytest.raises(NotFoundError) as info:
        await openai.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"


async def test_chat_completion_passes_through_with_routing_headers(
    gateway: ManagedProcess, replicas: list[ManagedProcess]
) -> None:
    raw = await official_client(gateway.url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
    )
    completion = raw.parse()
    assert raw.headers[headers.POOL] == "small"
    assert raw.headers[headers.ROUTE] in ("prefix-home", "prefix-hit")
    assert raw.headers[headers.REQUEST_ID]
    served_by = next(r for r in replicas if r.url.endswith(raw.headers[headers.REPLICA]))
    direct = await official_client(served_by.url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
    )
    assert completion.choices[0].message.content == direct.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 12


async def test_streamed_chat_equals_what_the_replica_produced(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    whole = await openai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
    stream = await openai.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces: list[str] = []
    usage = None
    async for chunk in stream:
        pieces.extend(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 20


async def test_completions_streamed_and_not(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    prompt = "Once upon a time in a harbour town, " * 10
    whole = await openai.completions.create(model=MODEL, prompt=prompt, max_tokens=10)
    stream = await openai.completions.create(model=MODEL, prompt=prompt, max_tokens=10, stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == whole.choices[0].text
    assert len(text.split()) == 10


async def test_a_repeated_prefix_is_served_from_the_replicas_cache(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    system = "Long shared context about maritime law. " * 60
    cached = []
    for question in ("first question", "second question", "third question"):
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        reply = await openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
    assert cached[0] == 0
    assert min(cached[1:]) >= len(system) // 4 * 0.9


async def test_unknown_model_is_a_model_not_found_error(gateway: ManagedProcess) -> None:
    with pytest.raises(NotFoundError) as info:
        await official_client(gateway.url).chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert info.value.code == "model_not_found"


async def test_completions_with_a_list_of_prompts(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    raw = await openai.completions.with_raw_response.create(
        model=MODEL, prompt=["The harbour at dawn", "The harbour at dusk"], max_tokens=5
    )
    batch = raw.parse()
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text != batch.choices[1].text
    assert raw.headers[headers.POOL] == "small"
    tokens = await openai.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=3)
    assert len(tokens.choices) == 2


async def test_n_choices_pass_through(gateway: ManagedProcess) -> None:
    reply = await official_client(gateway.url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        max_tokens=4,
    )
    assert [c.index for c in reply.choices] == [0, 1]


async def test_embeddings_go_by_load(gateway: ManagedProcess) -> None:
    raw = await official_client(gateway.url).embeddings.with_raw_response.create(
        model=MODEL, input=["a container ship", "a fishing boat"]
    )
    embeddings = raw.parse()
    assert [d.index for d in embeddings.data] == [0, 1]
    assert len(embeddings.data[0].embedding) == 32
    assert raw.headers[headers.ROUTE] == "least-loaded"


async def test_responses_follow_up_goes_to_the_replica_that_stored_the_first(
    gateway: ManagedProcess,
) -> None:
    openai = official_client(gateway.url)
    # Conversations until both replicas store some (at least 6): a follow-up sent to the other
    # replica would get its 404. New ones go by recent load, and this module's earlier requests
    # may have left one replica the busier for the first few.
    replicas: set[str] = set()
    for i in range(20):
        if i >= 6 and len(replicas) == 2:
            break
        raw = await openai.responses.with_raw_response.create(
            model=MODEL, instructions=f"Conversation {i}. " * 30, input="Hello?",
            max_output_tokens=4,
        )  # fmt: skip
        first = raw.parse()
        replicas.add(raw.headers[headers.REPLICA])
        follow = await openai.responses.with_raw_response.create(
            model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=4
        )
        assert follow.headers[headers.REPLICA] == raw.headers[headers.REPLICA]
        assert follow.parse().previous_response_id == first.id
        # The operator's dry run names the replica the follow-up would be pinned to.
        again = {"model": MODEL, "input": "Again?", "previous_response_id": first.id}
        dry_run = await admin_route(gateway.url, ADMIN_TOKEN, again, "/v1/responses")
        assert dry_run["replica"] == raw.headers[headers.REPLICA]
    assert len(replicas) == 2


async def test_a_follow_up_says_it_was_pinned_and_is_counted_so(gateway: ManagedProcess) -> None:
    # docs/contract.md: `pinned` is the route of a follow-up held to its stored response's
    # replica, whatever the pool's policy would have said of the one replica it was left.
    openai = official_client(gateway.url)
    before = await metric_sum(gateway.url, "gateway_requests_total", route="pinned")
    for i in range(3):
        raw = await openai.responses.with_raw_response.create(
            model=MODEL, input=f"Pin {i}. " * 20, max_output_tokens=2
        )
        assert raw.headers[headers.ROUTE] != "pinned"  # a first turn: the policy's choice
        follow = await openai.responses.with_raw_response.create(
            model=MODEL, input="Next?", previous_response_id=raw.parse().id, max_output_tokens=2
        )
        assert follow.headers[headers.REPLICA] == raw.headers[headers.REPLICA]
        assert follow.headers[headers.ROUTE] == "pinned"

    async def counted() -> bool:
        now = await metric_sum(gateway.url, "gateway_requests_total", route="pinned")
        return now == before + 3

    assert await eventually(counted)


async def test_responses_usage_teaches_the_pool_but_not_a_follow_ups(
    replicas: list[ManagedProcess],
) -> None:
    # A gateway of its own: what it learns here is from these requests alone.
    env = {"GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    async with running_gateway([r.url for r in replicas], env=env) as gateway:
        openai = official_client(gateway.url)
        untaught = await learned_chars_per_token(gateway.url, ADMIN_TOKEN)
        stored = []
        for i in range(3):
            stored.append(
                await openai.responses.create(
                    model=MODEL, input=f"Tell me about parcel {i}. " * 60, max_output_tokens=4
                )
            )
        await asyncio.sleep(0.2)  # an answer's usage is read just after it is written
        taught = await learned_chars_per_token(gateway.url, ADMIN_TOKEN)
        assert taught != untaught  # the replicas' input_tokens were read
        # A follow-up's prompt is its stored history too, which the gateway never saw.
        for first in stored:
            await openai.responses.create(
                model=MODEL, input="Shorter?", previous_response_id=first.id, max_output_tokens=4
            )
        await asyncio.sleep(0.2)
        assert await learned_chars_per_token(gateway.url, ADMIN_TOKEN) == taught


async def test_streamed_response_is_relayed_and_its_id_learned(gateway: ManagedProcess) -> None:
    openai = official_client(gateway.url)
    for i in range(4):
        stream = await openai.responses.create(
            model=MODEL, input=f"Story {i}: " * 40, max_output_tokens=6, stream=True
        )
        deltas, completed = [], None
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                completed = event.response
        assert completed is not None and "".join(deltas) == completed.output_text
        follow = await openai.responses.create(
            model=MODEL, input="Go on.", previous_response_id=completed.id, max_output_tokens=3
        )
        # Served where the first is stored; cut by max_output_tokens, so incomplete, as in vLLM.
        assert follow.previous_response_id == completed.id and follow.status == "incomplete"


async def test_a_stored_response_is_retrieved_from_the_replica_that_holds_it(
    gateway: ManagedProcess,
) -> None:
    openai = official_client(gateway.url)
    for i in range(4):
        raw = await openai.responses.with_raw_response.create(
            model=MODEL, input=f"Keep note {i}. " * 30, max_output_tokens=3
        )
        made = raw.parse()
        got = await openai.responses.with_raw_response.retrieve(made.id)
        assert got.parse().output_text == made.output_text
        assert got.headers[headers.REPLICA] == raw.headers[headers.REPLICA]
        assert got.headers[headers.ROUTE] == "pinned"
        # The replica's own answer is relayed: vLLM cannot cancel a finished response.
        with pytest.raises(BadRequestError):
            await openai.responses.cancel(made.id)
    with pytest.raises(NotFoundError) as info:
        await openai.responses.retrieve("resp_never_seen")
    assert info.value.param == "response_id"


async def test_an_adapter_is_served_by_its_pool_and_stays_on_its_home(
    gateway: ManagedProcess,
) -> None:
    openai = official_client(gateway.url)
    served = set()
    for i in range(6):
        raw = await openai.completions.with_raw_response.create(
            model=ADAPTER, prompt=f"SELECT {i} FROM ships", max_tokens=3
        )
        assert raw.parse().model == ADAPTER
        assert raw.headers[headers.POOL] == "small"
        served.add(raw.headers[headers.REPLICA])
    assert len(served) == 1


async def test_an_adapter_the_replicas_list_is_learned_and_routed(
    gateway: ManagedProcess,
) -> None:
    openai = official_client(gateway.url)
    deadline = time.monotonic() + 15
    while LEARNED not in [m.id for m in (await openai.models.list()).data]:
        assert time.monotonic() < deadline, "the adapter was never learned"
        await asyncio.sleep(0.2)
    card = await openai.models.retrieve(LEARNED)
    assert card.model_extra == {"root": LEARNED, "parent": MODEL}
    raw = await openai.completions.with_raw_response.create(
        model=LEARNED, prompt="In a calm voice:", max_tokens=3
    )
    assert raw.parse().model == LEARNED and raw.headers[headers.POOL] == "small"


async def post(url: str, body: Any) -> tuple[int, dict[str, str], Any]:
    data = body if isinstance(body, bytes) else None
    json = None if data is not None else body
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=json, data=data) as response,
    ):
        return response.status, dict(response.headers), await response.json()


async def test_tokenize_and_detokenize_go_to_a_replica_of_the_pool(gateway: ManagedProcess) -> None:
    status, hdrs, tokens = await post(
        f"{gateway.url}/tokenize", {"model": MODEL, "prompt": "hello harbour"}
    )
    assert status == 200 and tokens["count"] == len(tokens["tokens"]) > 0
    assert hdrs[headers.POOL] == "small"
    # With one model served, the model may be left out, as vLLM allows.
    status, _, text = await post(f"{gateway.url}/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200 and text["prompt"] == "hello harbour"


async def test_score_and_rerank_pass_through(gateway: ManagedProcess) -> None:
    status, hdrs, score = await post(
        f"{gateway.url}/v1/score", {"model": MODEL, "text_1": "ship", "text_2": ["ship", "cat"]}
    )
    assert status == 200 and len(score["data"]) == 2
    assert hdrs[headers.ROUTE] == "least-loaded"
    status, _, rerank = await post(
        f"{gateway.url}/v1/rerank", {"model": MODEL, "query": "ship", "documents": ["cat", "ship"]}
    )
    assert status == 200 and rerank["results"][0]["index"] == 1


ENDPOINT_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
    "/v1/embeddings": {"input": "hi"},
    "/v1/score": {"text_1": "a", "text_2": "b"},
    "/v1/rerank": {"query": "a", "documents": ["b"]},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1]},
}
MALFORMED = {"prompt": 7, "input": 7, "messages": 7, "tokens": 7, "query": None, "text_1": 1}


@pytest.mark.parametrize("path", ENDPOINT_BODIES)
async def test_every_endpoint_answers_openai_errors(gateway: ManagedProcess, path: str) -> None:
    url = f"{gateway.url}{path}"
    status, _, error = await post(url, {**ENDPOINT_BODIES[path], "model": "gpt-9"})
    assert status == 404 and error["error"]["code"] == "model_not_found"
    status, _, error = await post(url, b"{not json")
    assert status == 400 and error["error"]["type"] == "invalid_request_error"
    status, _, error = await post(url, {"model": MODEL, **MALFORMED})
    assert status == 400 and error["error"]["param"]


async def test_sdk_raises_bad_request_for_a_malformed_responses_input(
    gateway: ManagedProcess,
) -> None:
    with pytest.raises(BadRequestError) as info:
        await official_client(gateway.url).responses.create(model=MODEL, input=7)  # type: ignore[call-overload]
    assert info.value.param == "input"


async def requests_total(url: str) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    totals: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_requests_total":
                key = (sample.labels["pool"], sample.labels["code"])
                totals[key] = totals.get(key, 0.0) + sample.value  # summed over routes
    return totals


async def test_every_endpoint_is_counted_in_gateway_requests_total(
    gateway: ManagedProcess,
) -> None:
    before = await requests_total(gateway.url)
    for path, body in ENDPOINT_BODIES.items():
        if path == "/detokenize":
            continue  # the sim only detokenizes ids it produced
        status, _, _ = await post(f"{gateway.url}{path}", {**body, "model": MODEL})
        assert status == 200, path
        await post(f"{gateway.url}{path}", {**body, "model": "gpt-9"})
    after = await requests_total(gateway.url)
    sent = len(ENDPOINT_BODIES) - 1
    assert after[("small", "200")] - before.get(("small", "200"), 0) == sent
    assert after[(NO_POOL, "404")] - before.get((NO_POOL, "404"), 0) == sent
