"""The gateway through the official OpenAI client: the API clients already use, unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from openai import AsyncOpenAI, NotFoundError

from gateway import headers
from replica.processes import ManagedProcess
from tests.conftest import MODEL, running_gateway, running_sims

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are a terse assistant for a shipping company. " * 20
MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Where is my parcel?"},
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas() -> AsyncIterator[list[ManagedProcess]]:
    async with running_sims(2, decode_step_s=0.002) as fleet:
        yield fleet


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(replicas: list[ManagedProcess]) -> AsyncIterator[ManagedProcess]:
    async with running_gateway([r.url for r in replicas]) as gw:
        yield gw


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


async def test_models_lists_every_pools_model(gateway: ManagedProcess) -> None:
    models = await client(gateway.url).models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_chat_completion_passes_through_with_routing_headers(
    gateway: ManagedProcess, replicas: list[ManagedProcess]
) -> None:
    raw = await client(gateway.url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert raw.headers[headers.POOL] == "small"
    assert raw.headers[headers.ROUTE] in ("prefix-home", "prefix-hit")
    assert raw.headers[headers.REQUEST_ID]
    served_by = next(r for r in replicas if r.url.endswith(raw.headers[headers.REPLICA]))
    direct = await client(served_by.url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == direct.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 12


async def test_streamed_chat_equals_what_the_replica_produced(gateway: ManagedProcess) -> None:
    openai = client(gateway.url)
    whole = await openai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)  # type: ignore[arg-type]
    stream = await openai.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, usage = [], None
    async for chunk in stream:
        pieces.extend(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 20


async def test_completions_streamed_and_not(gateway: ManagedProcess) -> None:
    openai = client(gateway.url)
    prompt = "Once upon a time in a harbour town, " * 10
    whole = await openai.completions.create(model=MODEL, prompt=prompt, max_tokens=10)
    stream = await openai.completions.create(model=MODEL, prompt=prompt, max_tokens=10, stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == whole.choices[0].text
    assert len(text.split()) == 10


async def test_a_repeated_prefix_is_served_from_the_replicas_cache(gateway: ManagedProcess) -> None:
    openai = client(gateway.url)
    system = "Long shared context about maritime law. " * 60
    cached = []
    for question in ("first question", "second question", "third question"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        reply = await openai.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
    assert cached[0] == 0
    assert min(cached[1:]) >= len(system) // 4 * 0.9


async def test_unknown_model_is_a_model_not_found_error(gateway: ManagedProcess) -> None:
    with pytest.raises(NotFoundError) as info:
        await client(gateway.url).chat.completions.create(model="gpt-9", messages=MESSAGES)  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"
