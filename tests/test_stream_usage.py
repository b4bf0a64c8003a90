"""Streams whose client did not ask for usage: the gateway asks the replica for it, learns from
it, and the client gets the stream it asked for, without that event. A client that asked gets
it as ever, and with `GATEWAY_STREAM_USAGE=false` nothing is asked."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.http.request_body import Endpoint, parse_request
from gateway.relay.stream_usage import (
    USAGE_EVENT_MAX_BYTES,
    UsageDropped,
    WholeEvents,
    asking_usage,
)
from gateway.relay.usage import PromptUsage, final_usage_part, prompt_usage, usage_object
from tests.conftest import (
    MODEL,
    Handler,
    fake_replica,
    in_process_gateway,
    in_process_sims,
    learned_chars_per_token,
    metric,
    official_client,
    pool_policy,
    running_gateway,
    running_sims,
)
from tests.rate_limits import ACME_KEY, limited_policy, tenant
from tests.sim import STREAM_OPTIONS_USAGE, ZERO_DELAY

ADMIN_TOKEN = "test-admin-token"
CHUNK = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
USAGE = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"total_tokens":11}}\n\n'
NULL_USAGE = CHUNK.replace(b"}]}", b'}],"usage":null}')
DONE = b"data: [DONE]\n\n"
ASKED = {"include_usage": True}
CONTINUOUS = {"continuous_usage_stats": True}


def sent(endpoint: Endpoint, **body: Any) -> bytes | None:
    raw = orjson.dumps({"model": MODEL, **body})
    return asking_usage(parse_request(endpoint, raw, 64))


def test_a_chat_or_completions_stream_asks_for_usage_keeping_its_other_options() -> None:
    messages = [{"role": "user", "content": "hi"}]
    chat = sent(Endpoint.CHAT, messages=messages, stream=True)
    assert chat is not None
    assert orjson.loads(chat) == {
        "model": MODEL, "messages": messages, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    options = {"include_usage": False, "vendor_option": 1}
    completion = sent(Endpoint.COMPLETIONS, prompt="hi", stream=True, stream_options=options)
    assert completion is not None
    assert orjson.loads(completion)["stream_options"] == {"include_usage": True, "vendor_option": 1}


def test_the_body_asking_for_usage_is_the_clients_byte_for_byte_but_for_its_stream_options() -> (
    None
):
    # A number past 64 bits (a json_schema's const, a metadata id) or a float's spelling would
    # not survive a parse and a dump: the replica gets them as the client wrote them.
    raw = (
        b'{"model": "%s", "stream": true, "messages": [{"role": "user", "content": "hi"}],\n'
        b' "metadata": {"big": 123456789012345678901234567890, "f": 1.50},'
        b' "stream_options": {"include_usage": false}}  \n' % MODEL.encode()
    )
    asked = asking_usage(parse_request(Endpoint.CHAT, raw, 64))
    assert asked is not None
    assert asked.startswith(raw.rstrip()[:-1])
    assert b'123456789012345678901234567890, "f": 1.50' in asked
    assert orjson.loads(asked)["stream_options"] == ASKED


# vLLM 0.32's StreamOptions: `include_usage: bool | None = False` (measured against a real
# replica: `stream_options: {}` ends with no usage event).
@pytest.mark.parametrize(
    ("options", "forwarded"),
    [
        (None, ASKED),
        ({}, ASKED),
        ({"include_usage": None}, ASKED),
        ({"include_usage": False}, ASKED),
        # pydantic's lax booleans: vLLM reads these as false, and the stream would go uncharged.
        ({"include_usage": "false"}, ASKED),
        ({"include_usage": "No"}, ASKED),
        ({"include_usage": "0"}, ASKED),
        ({"include_usage": "true"}, None),
        # Continuous usage comes only with include_usage: asked for the one, not the other.
        ({"include_usage": False, "continuous_usage_stats": True}, ASKED),
        (CONTINUOUS, ASKED),
        (ASKED, None),
    ],
)
def test_a_stream_asks_for_usage_only_where_vllm_would_end_it_without(
    options: dict[str, Any] | None, forwarded: dict[str, Any] | None
) -> None:
    asked = sent(Endpoint.COMPLETIONS, prompt="hi", stream=True, stream_options=options)
    assert (asked and orjson.loads(asked)["stream_options"]) == forwarded


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (Endpoint.CHAT, {"messages": [{"role": "user", "content": "hi"}]}),  # not a stream
        (Endpoint.COMPLETIONS, {"prompt": "hi", "stream": True, "stream_options": ASKED}),
        (Endpoint.RESPONSES, {"input": "hi", "stream": True}),  # ends with its usage anyway
    ],
)
def test_what_is_sent_as_the_client_sent_it(endpoint: Endpoint, body: dict[str, Any]) -> None:
    assert sent(endpoint, **body) is None


@pytest.mark.parametrize(("options", "usage"), STREAM_OPTIONS_USAGE)
async def test_the_client_gets_the_usage_event_exactly_when_vllm_would_send_it(
    options: dict[str, Any] | None, usage: bool
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True, "stream_options": options}  # fmt: skip
    async with (
        in_process_sims(1, MODEL, **ZERO_DELAY) as replicas,
        in_process_gateway(pool_policy(replicas)) as gateway,
        gateway.post("/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        events = (await response.read()).split(b"\n\n")
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events if e.startswith(b"data: {")]
    assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [2] * usage
    # vLLM 0.32 puts no usage field on the other chunks, asked or not (OpenAI's `"usage": null`
    # is not vLLM's): only continuous_usage_stats would.
    assert not any("usage" in c for c in chunks if c["choices"])
    assert events[-2] == b"data: [DONE]"


def test_the_usage_event_is_dropped_and_every_other_goes_through_whole() -> None:
    client = UsageDropped()
    assert client(CHUNK) == CHUNK
    assert client(CHUNK + USAGE + DONE) == CHUNK + DONE
    assert client.rest() == b""


def test_an_event_split_between_chunks_waits_for_its_end() -> None:
    client = UsageDropped()
    stream = CHUNK + USAGE + DONE
    parts = [client(stream[i : i + 7]) for i in range(0, len(stream), 7)]
    assert b"".join(parts) == CHUNK + DONE
    client(b"data: {")
    assert client.rest() == b"data: {"  # a stream cut there: what came goes on


def reads_of(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r", b"\n"], ids=["CRLF", "CR", "LF"])
def test_events_end_at_any_blank_line_sse_allows_however_the_reads_split_them(
    line_end: bytes,
) -> None:
    def ends(stream: bytes) -> bytes:
        return stream.replace(b"\n", line_end)

    stream = ends(CHUNK + USAGE + CHUNK + DONE)
    client = UsageDropped()
    assert client(ends(CHUNK)) == ends(CHUNK)  # whole events go on at once
    for size in (1, 2, 3, 5, 7, len(stream)):
        client = UsageDropped()
        shown = b"".join(client(read) for read in reads_of(stream, size)) + client.rest()
        assert shown == ends(CHUNK + CHUNK + DONE), size


def test_an_event_too_long_to_be_the_usage_goes_on_as_it_comes_and_little_is_held() -> None:
    long = b'data: {"id":"c1","choices":[{"delta":{"content":"' + b"x" * (1 << 20) + b'"}}]}\n\n'
    stream = CHUNK + long + USAGE + DONE
    client = UsageDropped()
    shown = []
    for read in reads_of(stream, 64 * 1024):
        shown.append(client(read))
        assert len(client._held) <= USAGE_EVENT_MAX_BYTES
    assert sum(map(len, shown[1:-1])) > len(long) - 2 * 64 * 1024  # not held to its end
    assert b"".join(shown) + client.rest() == CHUNK + long + DONE


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r", b"\n"], ids=["CRLF", "CR", "LF"])
def test_a_stream_whose_usage_is_not_dropped_still_goes_in_whole_events(line_end: bytes) -> None:
    # A stream that breaks mid-event then leaves no half event for the error event to join.
    stream = (CHUNK + USAGE + CHUNK + DONE).replace(b"\n", line_end)
    for size in (1, 2, 3, 5, 7, len(stream)):
        whole = WholeEvents()
        shown = [whole(read) for read in reads_of(stream, size)]
        assert all(not part or part.endswith(line_end * 2) for part in shown), size
        assert b"".join(shown) == stream and whole.rest() == b""
    whole = WholeEvents()
    assert whole(CHUNK + CHUNK[:9]) == CHUNK
    assert whole.rest() == CHUNK[:9]  # what a stream cut there leaves: not sent with an error


def test_a_long_event_or_compressed_bytes_go_on_as_they_come() -> None:
    long = b'data: {"choices":[{"text":"' + b"x" * (1 << 20) + b'"}]}\n\n'
    whole, shown = WholeEvents(), []
    for read in reads_of(CHUNK + long + DONE, 64 * 1024):
        shown.append(whole(read))
        assert len(whole._held) <= USAGE_EVENT_MAX_BYTES + 64 * 1024
    assert b"".join(shown) + whole.rest() == CHUNK + long + DONE
    assert WholeEvents(raw=True)(b"\x1f\x8b\x08 half") == b"\x1f\x8b\x08 half"


def test_a_huge_event_costs_time_in_proportion_to_its_size() -> None:
    # 16 MiB in 16 KiB reads: copying what came before on every read is gigabytes.
    stream = CHUNK + b'data: {"choices":[{"text":"' + b"x" * (16 << 20) + b'"}]}\n\n' + DONE
    client = UsageDropped()
    started = time.perf_counter()
    shown = b"".join(client(read) for read in reads_of(stream, 16 * 1024))
    assert time.perf_counter() - started < 1.0
    assert shown == stream


def test_the_usage_null_vllm_adds_once_asked_is_not_shown_however_the_reads_split_it() -> None:
    stream = NULL_USAGE + NULL_USAGE + USAGE + DONE
    for size in (1, 5, 13, len(stream)):
        client = UsageDropped()
        shown = b"".join(client(read) for read in reads_of(stream, size)) + client.rest()
        assert shown == CHUNK + CHUNK + DONE, size
    # An event too long to be held back loses it all the same.
    long = NULL_USAGE.replace(b'"Hi"', b'"' + b"x" * USAGE_EVENT_MAX_BYTES + b'"')
    for size in (1000, 4099):
        client = UsageDropped()
        shown = b"".join(client(read) for read in reads_of(long + DONE, size)) + client.rest()
        assert shown == long.replace(b',"usage":null', b"") + DONE, size


async def test_a_stream_without_usage_teaches_the_pool_and_its_client_never_sees_the_event() -> (
    None
):
    env = {"GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
    async with running_sims(1) as sims, running_gateway([sims[0].url], env=env) as gateway:
        openai = official_client(gateway.url)
        untaught = await learned_chars_per_token(gateway.url, ADMIN_TOKEN)
        for i in range(3):
            stream = await openai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Tell me about parcel {i}. " * 60}],
                max_tokens=4,
                stream=True,
            )
            chunks = [chunk async for chunk in stream]
            assert chunks and all(chunk.choices and chunk.usage is None for chunk in chunks)
        await asyncio.sleep(0.2)  # an answer's usage is read just after it is written
        taught = await learned_chars_per_token(gateway.url, ADMIN_TOKEN)
        assert taught != untaught
        # A client that asks for usage gets it, as ever.
        stream = await openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        last = [chunk async for chunk in stream][-1]
        assert last.choices == [] and last.usage is not None and last.usage.prompt_tokens > 0


async def test_switched_off_a_stream_without_usage_teaches_nothing() -> None:
    env = {"GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN, "GATEWAY_STREAM_USAGE": "false"}
    async with running_sims(1) as sims, running_gateway([sims[0].url], env=env) as gateway:
        openai = official_client(gateway.url)
        untaught = await learned_chars_per_token(gateway.url, ADMIN_TOKEN)
        stream = await openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me about parcels. " * 60}],
            max_tokens=4,
            stream=True,
        )
        assert all([chunk.choices async for chunk in stream])
        await asyncio.sleep(0.2)
        assert await learned_chars_per_token(gateway.url, ADMIN_TOKEN) == untaught


def test_a_streams_usage_is_read_from_its_final_event_only() -> None:
    # vLLM's continuous_usage_stats: each chunk carries its choice's running usage (one
    # prompt's, in a batch); only the event without choices counts the whole request.
    chunk = b'data: {"choices":[{"index":1,"text":"a"}],"usage":{"prompt_tokens":3}}\n\n'
    final = b'data: {"choices":[],"usage":{"prompt_tokens":16,"total_tokens":20}}\n\n'
    assert final_usage_part(chunk) is None
    part = final_usage_part(chunk + final)
    assert part is not None and prompt_usage(part) == PromptUsage(16, None)


def test_the_usage_of_a_prompt_with_an_image_is_read() -> None:
    # vLLM 0.32 counts an image's tokens per modality inside the details: two levels deep.
    details = b'"prompt_tokens_details":{"cached_tokens":16,"multimodal_tokens":{"image":576}}'
    final = b'data: {"choices":[],"usage":{"prompt_tokens":600,' + details + b"}}\n\n"
    found = usage_object(final)
    assert found is not None and prompt_usage(found) == PromptUsage(600, 16)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBO" * 50_000}}
NOT_PLAIN_WORDS: dict[str, tuple[str, dict[str, Any]]] = {
    "an image": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, IMAGE]}]}),
    "a batch": ("/v1/completions", {"prompt": ["Tell me about parcels. " * 20, "And boxes?"]}),
    "token ids": ("/v1/completions", {"prompt": list(range(1, 400))}),
}  # fmt: skip


async def test_only_a_prompts_own_words_teach_the_characters_per_token() -> None:
    # An image's base64 is 100x its tokens' size, token ids and a batch's first prompt are
    # not what its usage counted: each would pull every prompt's token estimate away.
    async with (
        in_process_sims(1, MODEL, **ZERO_DELAY) as urls,
        in_process_gateway(pool_policy(urls), admin_token=ADMIN_TOKEN) as gateway,
    ):
        url = str(gateway.make_url("")).rstrip("/")
        untaught = await learned_chars_per_token(url, ADMIN_TOKEN)
        for path, body in NOT_PLAIN_WORDS.values():
            async with gateway.post(path, json={"model": MODEL, "max_tokens": 2, **body}) as r:
                assert r.status == 200, await r.text()
        assert await learned_chars_per_token(url, ADMIN_TOKEN) == untaught
        plain = {"messages": [{"role": "user", "content": "Tell me about parcels. " * 20}]}
        async with gateway.post("/v1/chat/completions", json={"model": MODEL, **plain}) as r:
            assert r.status == 200
        assert await learned_chars_per_token(url, ADMIN_TOKEN) != untaught


def split_at(usage: bytes, cut: int) -> Handler:
    """A replica streaming a token, then ``usage`` in two reads split at ``cut``."""

    async def split_usage(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for part in (CHUNK + usage[:cut], usage[cut:] + DONE):
            await response.write(part)
            await asyncio.sleep(0.05)  # each half a read of its own
        return response

    return split_usage


LONG_PROMPT = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 900}], "stream": True}


@pytest.mark.parametrize("cut", [USAGE.index(b"prompt_tokens") + 4, USAGE.index(b"total")])
async def test_a_usage_event_split_across_two_reads_teaches_the_pool(cut: int) -> None:
    async with (
        fake_replica(split_at(USAGE, cut)) as url,
        in_process_gateway(pool_policy([url]), admin_token=ADMIN_TOKEN) as gateway,
    ):
        here = str(gateway.make_url("")).rstrip("/")
        untaught = await learned_chars_per_token(here, ADMIN_TOKEN)
        async with gateway.post("/v1/chat/completions", json=LONG_PROMPT) as r:
            assert (await r.read()).endswith(DONE)
        assert await learned_chars_per_token(here, ADMIN_TOKEN) != untaught


@pytest.mark.parametrize("cut", [b'"prompt_tokens":12', b'"total_tokens":1'], ids=bytes.decode)
async def test_a_usage_split_inside_a_figure_is_read_whole(cut: bytes) -> None:
    """A read that ends inside the usage object has only some of its figures, the last perhaps
    cut short: it is read once whole (a tenant was charged 1 token of 1,300, or the pool taught
    a prompt of 12 tokens)."""
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1234,"total_tokens":1300}}\n\n'
    limits = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=100_000)}}
    async with (
        fake_replica(split_at(usage, usage.index(cut) + len(cut))) as url,
        in_process_gateway(limited_policy([url], **limits)) as gateway,
    ):
        key = {"Authorization": f"Bearer {ACME_KEY}"}
        async with gateway.post("/v1/chat/completions", json=LONG_PROMPT, headers=key) as r:
            assert (await r.read()).endswith(DONE)
        await asyncio.sleep(0.05)
        text = await (await gateway.get("/metrics")).text()
    assert metric(text, "gateway_tenant_tokens_total", tenant="acme") == 1300
