"""The relay's HTTP/1.1 client to the replicas: keep-alive reuse, the ends of an answer, and the
failures the forwarder tells apart, against a raw socket server that answers exactly the bytes
each test scripts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from gateway.relay import upstream
from gateway.relay.upstream import UpstreamResponse, Upstreams
from gateway.relay.upstream_errors import (
    BadAnswer,
    ReadTimeout,
    ReplicaDisconnected,
    ReplicaUnreachable,
)
from replica.processes import free_port

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script`` on every connection; yields its URL and a list that counts
    the connections it accepted."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()


def answering(*answers: bytes, then_close: bool = False) -> Script:
    """Answers each request on a connection with the next of ``answers``, in order."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await read_request(reader)
            writer.write(answer)
            await writer.drain()
        if not then_close:
            await reader.read()  # until the client closes

    return script


async def body_of(response: UpstreamResponse) -> bytes:
    parts = []
    while chunk := await response.readany():
        parts.append(chunk)
    return b"".join(parts)


async def post(client: Upstreams, url: str, wait: float = 5.0) -> UpstreamResponse:
    return await client.post(url, "/v1/chat/completions", b'{"model": "m"}', [("X-Id", "1")], wait)


async def test_requests_reuse_one_keep_alive_connection() -> None:
    async with raw_server(answering(JSON_OK, JSON_OK, JSON_OK)) as (url, connections):
        client = Upstreams(1.0, 5.0)
        for _ in range(3):
            response = await post(client, url)
            assert (response.status, response.content_type) == (200, "application/json")
            assert await body_of(response) == b"{}"
            response.release()
        await client.close()
    assert len(connections) == 1


async def test_the_request_carries_the_path_prefix_host_length_and_headers() -> None:
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(JSON_OK)
        await writer.drain()

    async with raw_server(script) as (url, _):
        client = Upstreams(1.0, 5.0)
        response = await client.post(
            f"{url}/prefix/", "/v1/completions", b"{}", [("X-Id", "7"), ("Bad", "a\r\nb")], 5.0
        )
        response.close()
    request = seen[0]
    assert request.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
    assert f"Host: {url.removeprefix('http://')}\r\n".encode() in request
    assert b"Content-Length: 2\r\n" in request and b"X-Id: 7\r\n" in request
    assert b"Bad:" not in request  # a value that would split the header is never sent


async def test_a_connection_the_replica_closed_is_replaced_not_failed() -> None:
    async with raw_server(answering(JSON_OK, then_close=True)) as (url, connections):
        client = Upstreams(1.0, 5.0)
        for _ in range(2):
            response = await post(client, url)
            assert await body_of(response) == b"{}"
            response.release()
            await asyncio.sleep(0.05)  # the close reaches the client
    assert len(connections) == 2


async def test_a_pooled_connection_closed_unnoticed_is_retried_once_on_a_new_one() -> None:
    async with raw_server(answering(JSON_OK, then_close=True)) as (url, connections):
        client = Upstreams(1.0, 5.0)
        response = await post(client, url)
        assert await body_of(response) == b"{}"
        conn = response._conn
        response.release()
        await asyncio.sleep(0.05)
        conn.lost = False  # as if the close were still in flight when the request is written
        response = await post(client, url)
        assert await body_of(response) == b"{}"
    assert len(connections) == 2


async def test_idle_connections_past_the_replicas_keep_alive_are_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream, "IDLE_S", 0.0)
    async with raw_server(answering(JSON_OK, JSON_OK)) as (url, connections):
        client = Upstreams(1.0, 5.0)
        for _ in range(2):
            response = await post(client, url)
            await body_of(response)
            response.release()
    assert len(connections) == 2


async def test_chunked_and_close_delimited_answers_are_read_whole() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n6\r\n [1]\n\n\r\n0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}"
    async with raw_server(answering(chunked)) as (url, _):
        response = await post(Upstreams(1.0, 5.0), url)
        assert response.content_type == "text/event-stream"
        assert await body_of(response) == b"data: [1]\n\n"
    async with raw_server(answering(until_close, then_close=True)) as (url, _):
        response = await post(Upstreams(1.0, 5.0), url)
        assert await body_of(response) == b"{}"


async def test_a_large_answer_arrives_whole_when_read_slowly() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes several times
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    async with raw_server(answering(answer)) as (url, _):
        response = await post(Upstreams(1.0, 5.0), url)
        parts = []
        while chunk := await response.readany():
            parts.append(chunk)
            await asyncio.sleep(0)
        assert b"".join(parts) == body


async def test_a_replica_that_refuses_is_unreachable() -> None:
    client = Upstreams(1.0, 5.0)
    with pytest.raises(ReplicaUnreachable):
        await post(client, f"http://127.0.0.1:{free_port()}")


async def test_a_silent_replica_times_out_before_and_after_its_headers() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()

    async with raw_server(silent) as (url, _):
        with pytest.raises(ReadTimeout):
            await post(Upstreams(1.0, 5.0), url, wait=0.2)  # the head's own wait
    head_only = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"
    async with raw_server(answering(head_only)) as (url, _):
        response = await post(Upstreams(1.0, 0.2), url)
        assert await response.readany() == b"{"
        with pytest.raises(TimeoutError):
            await response.readany()


async def test_an_answer_cut_short_or_not_http_is_an_error() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"
    async with raw_server(answering(cut, then_close=True)) as (url, _):
        response = await post(Upstreams(1.0, 5.0), url)
        with pytest.raises(ReplicaDisconnected):
            await body_of(response)
    async with raw_server(answering(b"SSH-2.0-OpenSSH\r\n\r\n")) as (url, _):
        with pytest.raises(BadAnswer):
            await post(Upstreams(1.0, 5.0), url)


async def test_a_relay_hands_each_piece_to_its_sink_and_leaves_the_connection_reading() -> None:
    body = b"data: 1\n\ndata: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)

    async def head_then_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(reader)
            writer.write(head)
            await asyncio.sleep(0.05)  # the body comes while the relay runs
            writer.write(body)
        await reader.read()

    async with raw_server(head_then_body) as (url, connections):
        client = Upstreams(1.0, 0.5)
        response = await post(client, url)
        seen: list[bytes] = []

        def slow_client(piece: bytes) -> None:
            seen.append(piece)
            response.pause()  # as a full client socket would, here on the last piece

        await response.relay(slow_client)
        response.release()
        assert b"".join(seen) == body
        again = await post(client, url)  # the same connection: paused, it would time out
        assert await body_of(again) == body
    assert len(connections) == 1


async def test_a_relay_ends_with_what_its_sink_raised_and_closes_the_connection() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    async with raw_server(answering(head)) as (url, _):
        response = await post(Upstreams(1.0, 5.0), url)

        def gone(piece: bytes) -> None:
            raise ConnectionResetError("the client closed the connection")

        with pytest.raises(ConnectionResetError):
            await response.relay(gone)
        assert response._conn.lost


def held_by_the_client_for(response: UpstreamResponse, pause_s: float) -> Callable[[bytes], None]:
    """A sink whose client's socket fills on the first piece and drains ``pause_s`` later, as
    a client that stops reading for a while."""
    loop = asyncio.get_running_loop()
    pieces: list[bytes] = []

    def sink(piece: bytes) -> None:
        if not pieces:
            response.pause()
            loop.call_later(pause_s, response.resume)
        pieces.append(piece)

    return sink


async def test_a_client_holding_the_replica_back_longer_than_the_read_timeout_is_no_timeout() -> (
    None
):
    # The rest of the stream is sent at once: it waits in the socket while the client holds
    # the replica's reads, which is no silence of the replica's.
    first = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
    rest = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(first)
        await asyncio.sleep(0.1)  # the rest comes once the client is holding the reads
        writer.write(rest)
        await reader.read()

    async with raw_server(stream) as (url, _):
        response = await post(Upstreams(1.0, 0.2), url)
        await response.relay(held_by_the_client_for(response, 0.6))
        assert response._done


async def test_the_read_timeout_counts_the_replicas_silence_from_the_clients_resume() -> None:
    stalls = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
    async with raw_server(answering(stalls)) as (url, _):
        response = await post(Upstreams(1.0, 0.2), url)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ReadTimeout):
            await response.relay(held_by_the_client_for(response, 0.5))
        assert loop.time() - started >= 0.5 + 0.2
