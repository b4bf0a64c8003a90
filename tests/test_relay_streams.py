"""A stream relayed through the gateway, end to end: a client that reads slowly is no fault of
the replica's, and a stream's end is found however the replica's writes split it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.http.request_body import Endpoint
from gateway.relay.answers import StreamEnd
from tests.conftest import (
    MODEL,
    GatewayClient,
    Handler,
    eventually,
    fake_replica,
    in_process_gateway,
    in_process_sims,
    metric,
    metric_sum,
    pool_policy,
)
from tests.sim import ZERO_DELAY

CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
USAGE = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}\n\n'
DONE = b"data: [DONE]\n\n"


def stream_request(body: dict[str, object], *, chunked: bool = False) -> bytes:
    """The request for a stream; ``chunked``, its body sent in chunks, which the front hands
    to aiohttp to read and serve."""
    data = orjson.dumps({"model": MODEL, "stream": True, **body})
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)


async def slow_reader(gateway: GatewayClient) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose receive buffer is as small as the kernel allows: a client that stops
    reading soon fills it, then the gateway's socket to it, and the replica's reads pause."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (gateway.host, gateway.port))
    return await asyncio.open_connection(sock=sock)


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """An answer's head and chunked body, as they came, up to the body's last chunk."""
    raw = b""
    async with asyncio.timeout(30):
        while not raw.endswith(b"0\r\n\r\n"):
            more = await reader.read(65536)
            assert more, raw[-300:]
            raw += more
    return raw


@contextlib.asynccontextmanager
async def long_stream_to_a_slow_reader(
    *, chunked: bool = False, **settings: Any
) -> AsyncIterator[tuple[GatewayClient, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A gateway (``settings``) over two replicas whose first failure ejects, and a client of
    it with a small receive buffer that has asked for a long stream and not read yet: a stream
    cut for the client's pause would eject the replica that served it."""
    async with (
        in_process_sims(2, MODEL, **ZERO_DELAY, num_blocks=4096) as replicas,
        in_process_gateway(
            pool_policy(replicas), outlier_consecutive_failures=1, **settings
        ) as gateway,
    ):
        reader, writer = await slow_reader(gateway)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20000}
        writer.write(stream_request(body, chunked=chunked))
        try:
            yield gateway, reader, writer
        finally:
            writer.close()


async def test_a_client_that_stops_reading_past_the_read_timeout_gets_its_stream_whole() -> None:
    async with long_stream_to_a_slow_reader(first_byte_timeout_s=0.3) as (gateway, reader, _):
        await asyncio.sleep(1.2)  # four read timeouts with the replica's reads paused
        raw = await read_chunked(reader)
        url = str(gateway.make_url("")).rstrip("/")
        assert await metric_sum(url, "gateway_requests_total", code="200") == 1.0
        assert await metric_sum(url, "gateway_replica_ejections_total") == 0
    assert b'"error"' not in raw and raw.count(b"data: [DONE]") == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["served by the front", "by aiohttp"])
async def test_a_client_that_leaves_its_answer_unread_past_the_send_timeout_is_let_go(
    chunked: bool,
) -> None:
    # It holds a batch slot and the replica's KV cache while it reads nothing: past the send
    # timeout it counts as gone (499), and its replica, which did nothing wrong, stays in.
    async with long_stream_to_a_slow_reader(chunked=chunked, send_timeout_s=0.3) as (gateway, _, _):
        url = str(gateway.make_url("")).rstrip("/")

        async def let_go() -> bool:
            return await metric_sum(url, "gateway_requests_total", code="499") == 1.0

        assert await eventually(let_go)
        assert await metric_sum(url, "gateway_replica_inflight") == 0
        assert await metric_sum(url, "gateway_replica_ejections_total") == 0


RESPONSES_STREAM = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hi"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed"}\n\n'
)
ENDED_STREAMS = [
    (Endpoint.CHAT, CHUNK + DONE),
    (Endpoint.COMPLETIONS, (CHUNK + DONE).replace(b"\n", b"\r\n")),
    (Endpoint.RESPONSES, RESPONSES_STREAM),
]


def every_split(stream: bytes) -> Iterator[list[bytes]]:
    """The stream as one read, as two and as three reads cut at every place, and a byte a read."""
    yield [stream]
    for i in range(1, len(stream)):
        yield [stream[:i], stream[i:]]
        for j in range(i + 1, len(stream)):
            yield [stream[:i], stream[i:j], stream[j:]]
    yield [stream[i : i + 1] for i in range(len(stream))]


def ended(endpoint: Endpoint, reads: list[bytes]) -> bool:
    end = StreamEnd(endpoint)
    for read in reads:
        end.feed(read)
    return end.ended


@pytest.mark.parametrize(("endpoint", "stream"), ENDED_STREAMS)
def test_a_streams_end_is_found_however_the_replicas_writes_split_it(
    endpoint: Endpoint, stream: bytes
) -> None:
    assert all(ended(endpoint, reads) for reads in every_split(stream))


@pytest.mark.parametrize(("endpoint", "stream"), ENDED_STREAMS)
def test_a_stream_cut_anywhere_before_its_end_marker_has_not_ended(
    endpoint: Endpoint, stream: bytes
) -> None:
    marker_end = stream.rindex(b"]" if endpoint is not Endpoint.RESPONSES else b"completed\n") + 1
    for cut in range(marker_end):
        assert not ended(endpoint, [stream[:cut]])
        assert not ended(endpoint, [stream[i : i + 1] for i in range(cut)])


def test_the_done_marker_ends_a_stream_only_as_its_last_event() -> None:
    assert not ended(Endpoint.CHAT, [CHUNK, DONE, CHUNK])
    # Model output cannot fake it: quotes and line breaks are escaped inside a JSON string.
    assert not ended(Endpoint.CHAT, [b'data: {"delta":"data: [DONE]\\n\\n"}\n\n'])
    assert not ended(Endpoint.COMPLETIONS, [b'data: {"text":"data: [DONE]"}\n\n'])


@pytest.mark.parametrize(("code", "refused"), [(500, False), (400, True)])
def test_vllms_error_event_and_whose_fault_it_is_are_found_however_the_writes_split_it(
    code: int, refused: bool
) -> None:
    error = b'data: {"error":{"message":"engine died","code":%d}}\n\n' % code
    for reads in every_split(CHUNK + error + DONE):
        end = StreamEnd(Endpoint.CHAT)
        for read in reads:
            end.feed(read)
        assert end.errored and end.ended
        assert end.refused is refused
    end = StreamEnd(Endpoint.CHAT)
    end.feed(b'data: {"delta":"data: {\\"error\\""}\n\n')  # model output cannot fake it
    assert not end.errored


def streaming(last_reads: Callable[[bytes], list[bytes]]) -> Handler:
    """A replica's chat handler: one event, the usage where asked, then the `data: [DONE]`
    event written as ``last_reads`` cuts it, each write apart from the next."""

    async def handler(request: web.Request) -> web.StreamResponse:
        options = (await request.json()).get("stream_options") or {}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(CHUNK + (USAGE if options.get("include_usage") else b""))
        for read in last_reads(DONE):
            await asyncio.sleep(0.01)
            await response.write(read)
        return response

    return handler


async def relayed(handler: Handler) -> tuple[bytes, str]:
    """What a client that did not ask for the usage gets of ``handler``'s stream through the
    gateway, and the gateway's metrics after it."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        fake_replica(handler) as url,
        in_process_gateway(pool_policy([url])) as gateway,
    ):
        async with gateway.post("/v1/chat/completions", json=body) as answer:
            assert answer.status == 200
            raw = await answer.read()
        metrics = await (await gateway.get("/metrics")).text()
    return raw, metrics


async def test_a_done_marker_written_apart_from_its_line_end_ends_the_stream_cleanly() -> None:
    raw, metrics = await relayed(streaming(lambda done: [done[:-1], done[-1:]]))
    assert raw == CHUNK + DONE
    assert metric(metrics, "gateway_requests_total", code="200") == 1.0
    assert metric(metrics, "gateway_requests_total", code="502") is None


async def test_a_done_marker_written_a_byte_at_a_time_ends_the_stream_cleanly() -> None:
    raw, metrics = await relayed(streaming(lambda done: [bytes([b]) for b in done]))
    assert raw == CHUNK + DONE
    assert metric(metrics, "gateway_requests_total", code="200") == 1.0
    assert metric(metrics, "gateway_requests_total", code="502") is None
