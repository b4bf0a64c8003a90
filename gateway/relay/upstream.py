"""The requests to the replicas, at the protocol level: pooled keep-alive HTTP/1.1 on the
event loop's transports, answers parsed by llhttp (httptools).

A general client (aiohttp's) builds a request object, a connector lookup, timers and stream
readers for every request; the relay needs one write and a parser's callbacks. Measured on one
zero-delay replica (docs/overhead.md) that machinery was a third of the gateway's CPU per
request. What it keeps of a general client: connection reuse with idle connections dropped
before the replica's keep-alive timer closes them, a read timeout on every wait, flow control
(a replica is not read faster than its bytes are taken), and the errors the forwarder tells
apart (the replica is down, it timed out, it broke the answer).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import cast

import httptools

from gateway.relay.upstream_errors import (
    BadAnswer,
    ConnectTimeout,
    ReadTimeout,
    ReplicaDisconnected,
    ReplicaUnreachable,
    UpstreamError,
)
from gateway.relay.upstream_target import Target

IDLE_S = 4.0
"""A pooled connection unused this long is closed rather than reused: vLLM's server closes
idle keep-alive connections after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and a request written
as it does so is lost."""
MAX_IDLE_PER_REPLICA = 256
"""Idle connections kept per replica: enough for the concurrency a gateway sees, few enough
that a burst does not leave thousands of sockets open."""
PAUSE_BYTES = 256 * 1024
"""An answer buffered beyond this pauses reading the replica until the relay catches up."""


class UpstreamResponse:
    """One answer: its status and headers at once, its body as it arrives."""

    __slots__ = (
        "_buffered", "_chunks", "_conn", "_done", "_error", "_heard", "_loop", "_paused",
        "_sink", "_timeout_s", "_waiter", "content_encoding", "content_length", "content_type",
        "content_type_header", "status",
    )  # fmt: skip

    def __init__(self, conn: _Connection, timeout_s: float) -> None:
        self._conn = conn
        self._loop = conn.loop
        self._timeout_s = timeout_s
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._heard = 0.0
        """When the last bytes came, or the client's pause ended, while a sink takes them."""
        # The headers the relay reads, and no others (a repeated one keeps its last value).
        self.status = 0
        self.content_type = ""
        """The media type alone, lower case, as aiohttp names it; "" when there is none."""
        self.content_type_header: str | None = None
        """The Content-Type header as sent (parameters included), relayed as it came."""
        self.content_encoding: str | None = None
        self.content_length: int | None = None

    async def readany(self) -> bytes:
        """What has arrived since the last read (waiting for some); b"" at the end."""
        if not self._chunks and not self._done and self._error is None:
            await self._wait()
        if self._chunks:
            chunks = self._chunks
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self._buffered = 0
            self.resume()
            return data
        if self._error is not None:
            raise self._error
        return b""

    async def relay(self, sink: Callable[[bytes], None]) -> None:
        """Hands the rest of the body to ``sink`` as it arrives, from the connection's own
        callback (no task wakes per chunk), until its end; raises what ``readany`` would, or
        what ``sink`` raised. The read timeout applies to each gap between chunks."""
        self._sink = sink
        self._heard = self._loop.time()
        if self._chunks:
            self._feed(await self.readany())  # what came with the head, to the sink alike
        try:
            while not self._done and self._error is None:
                await self._wait(idle=True)
        finally:
            self._sink = None
            self.resume()  # a connection goes back to the pool reading
        if self._error is not None:
            raise self._error

    def pause(self) -> None:
        """Stops reading the replica while a sink's client cannot take more (and its read
        timeout: that wait is the client's, not the replica's silence)."""
        if self._sink is not None:
            self._hold()

    def resume(self) -> None:
        if self._paused:
            self._paused, self._heard = False, self._loop.time()  # its silence starts now
            self._conn.resume()

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool if the answer ended
        cleanly and may be reused, else it is closed."""
        conn = self._conn
        if self._done and self._error is None and conn.keep_alive and not conn.lost:
            conn.pool.put(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Closes the connection: a replica serving vLLM aborts the request and frees its KV
        cache."""
        self._conn.close()

    async def _wait(self, idle: bool = False) -> None:
        """Until bytes, the end or an error; ``idle``: until the end or an error, the timeout
        counted from the last bytes a sink took."""
        waiter = self._waiter = self._loop.create_future()
        timer = self._loop.call_later(self._timeout_s, self._time_out, waiter, idle)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _time_out(self, waiter: asyncio.Future[None], idle: bool) -> None:
        if waiter.done():
            return
        # Paused, the client's full socket holds the replica back: a slow reader is no fault
        # of the replica's, to cut its stream and count towards its ejection.
        quiet = 0.0 if self._paused else self._loop.time() - self._heard
        if idle and quiet < self._timeout_s:
            # Bytes came meanwhile: one timer per timeout period, not one per chunk.
            self._loop.call_later(self._timeout_s - quiet, self._time_out, waiter, idle)
            return
        waiter.set_exception(ReadTimeout(f"no bytes from the replica in {self._timeout_s} s"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, body: bytes) -> None:
        sink = self._sink
        if sink is not None:
            self._heard = self._loop.time()
            try:
                sink(body)
            except Exception as exc:  # the sink's client went away: its relay ends with it
                self._sink = None
                self._error = exc
                self._conn.close()
                self._wake()
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > PAUSE_BYTES:
            self._hold()
        self._wake()

    def _hold(self) -> None:
        if not self._paused:
            self._paused = True
            self._conn.pause()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self._done and self._error is None:
            self._error = error
            self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica; the parser's callbacks fill its current answer."""

    def __init__(self, pool: _Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.keep_alive = False
        self.idle_since = 0.0
        self.received = False
        """Whether any byte of the current answer has arrived."""
        self._parser = httptools.HttpResponseParser(self)
        self._response: UpstreamResponse | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._delimited = False
        """Whether the current answer's end is marked (a length or chunks), not the close."""

    def request(self, data: bytes, timeout_s: float) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        self._response = UpstreamResponse(self, timeout_s)
        head = self._head = self.loop.create_future()
        self._headers = []
        self.received = False
        self.keep_alive = False
        if self.transport.is_closing():
            head.set_exception(ReplicaDisconnected("the replica closed the connection"))
        else:
            self.transport.write(data)
        return head

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.lost = True

    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they are alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(BadAnswer(f"not an HTTP/1.1 answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self._response
        if response is not None and self._head is not None and self._head.done():
            if exc is None and not self._delimited:
                response._finish()  # an answer that ends where the connection does
                return
        self._broken(ReplicaDisconnected("the replica closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        response, head = self._response, self._head
        if response is None or head is None or head.done():
            return
        response.status = self._parser.get_status_code()
        length: bytes | None = None
        chunked = False
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-type":
                kind = response.content_type_header = value.decode("latin-1")
                response.content_type = kind.split(";", 1)[0].strip().lower()
            elif lower == b"content-length":
                length = value
            elif lower == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lower == b"content-encoding":
                response.content_encoding = value.decode("latin-1")
        response.content_length = int(length) if length and length.isdigit() else None
        self._delimited = length is not None or chunked
        head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._response is not None:
            self._response._finish()

    def _broken(self, error: UpstreamError) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
        elif self._response is not None:
            self._response._fail(error)


class _Pool:
    """The idle connections to one replica, most recently used last."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.idle: deque[_Connection] = deque()

    def put(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self.idle.append(conn)
        while len(self.idle) > MAX_IDLE_PER_REPLICA:
            self.idle.popleft().close()

    def take(self) -> _Connection | None:
        idle = self.idle
        horizon = time.monotonic() - IDLE_S
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.idle_since > horizon:
                return conn
            conn.close()
        return None


class Upstreams:
    """Keep-alive connections to every replica, and POSTs over them."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._pools: dict[str, _Pool] = {}

    async def post(
        self, base_url: str, path: str, body: bytes, headers: Iterable[tuple[str, str]], wait: float
    ) -> UpstreamResponse:
        """Sends the request; returns once the answer's headers are in, within ``wait`` s. A
        pooled connection the replica closed before answering is replaced by a new one, once."""
        pool = self._pools.get(base_url) or self._pool(base_url)
        target = pool.target
        head = [b"POST ", target.prefix, path.encode(), b" HTTP/1.1\r\nHost: ", target.host_header]
        head.append(b"\r\nContent-Length: %d\r\n" % len(body))
        for name, value in headers:
            if "\r" in value or "\n" in value:
                continue  # never a header's own line
            head.append(f"{name}: {value}\r\n".encode(errors="surrogateescape"))  # as sent
        head.append(b"\r\n")
        data = b"".join(head) + body
        conn = pool.take()
        if conn is not None:
            try:
                return await self._send(conn, data, wait)
            except ReplicaDisconnected:
                if conn.received:
                    raise
        return await self._send(await self._connect(pool), data, wait)

    async def close(self) -> None:
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()

    async def _send(self, conn: _Connection, data: bytes, wait: float) -> UpstreamResponse:
        head = conn.request(data, self._read_timeout_s)
        timer = conn.loop.call_later(wait, _time_out_head, head, wait)
        try:
            return await head
        except BaseException:
            conn.close()
            raise
        finally:
            timer.cancel()

    async def _connect(self, pool: _Pool) -> _Connection:
        loop = asyncio.get_running_loop()
        target = pool.target
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(pool, loop), target.host, target.port, ssl=target.ssl
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {target.host}:{target.port} in {self._connect_timeout_s} s"
            ) from None
        except OSError as exc:
            raise ReplicaUnreachable(
                f"cannot connect to {target.host}:{target.port}: {exc.strerror or exc}"
            ) from None
        return conn

    def _pool(self, base_url: str) -> _Pool:
        pool = self._pools[base_url] = _Pool(Target.of(base_url))
        return pool


def _time_out_head(head: asyncio.Future[UpstreamResponse], wait: float) -> None:
    if not head.done():
        head.set_exception(ReadTimeout(f"no answer from the replica in {wait:g} s"))
