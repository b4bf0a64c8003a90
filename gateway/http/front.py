"""Client connections at the protocol level: completion requests framed, parsed by llhttp
(httptools) and answered on the transport; any other request hands its connection to aiohttp.

A web framework builds a request object, a router match, middleware frames, a response and a
writer per request; a relay needs one parse and one write each way. On one zero-delay replica
(docs/overhead.md) aiohttp's server side was most of the gateway's CPU per request once the
replica side was protocol-level too (gateway/relay/upstream.py).

The front takes an HTTP/1.1 POST to a completion path with a Content-Length body within the
body limit, no Expect, Content-Encoding or Transfer-Encoding and no upgrade: what the OpenAI
SDKs send. Anything else (the other endpoints, a chunked or compressed body, a malformed request
or one over aiohttp's limits, HTTP/1.0, a CONNECT) goes to aiohttp with the connection's bytes
as they came, once its first bytes or its head show it, and aiohttp serves the rest of that
connection: its answers, errors included, are the same as ever.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.headers import REQUEST_ID
from gateway.http.body_read import body_late
from gateway.http.connections import (
    MAX_HEAD_BYTES,
    RequestHead,
    framed_body_length,
    linger,
    response_head,
)
from gateway.http.errors import ApiError, shutting_down
from gateway.http.framed_request import Request
from gateway.http.request_body import Endpoint
from gateway.http.request_ids import request_id

log = logging.getLogger(__name__)

_ENDPOINTS = {endpoint.value.encode(): endpoint for endpoint in Endpoint}
_POST = b"POST "
"""How every request the front takes begins."""


class FrontExchange:
    """The answer to a request the front framed, written to its connection's transport."""

    __slots__ = ("_chunked", "_conn", "_started", "headers")
    direct = True  # a relay may write each chunk from the replica connection's callback

    def __init__(self, conn: FrontConnection, headers: CIMultiDictProxy[str]) -> None:
        self._conn = conn
        self.headers: Mapping[str, str] = headers
        self._started = False
        self._chunked = False

    @property
    def started(self) -> bool:
        return self._started

    async def answer(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        await self._head(status, headers, b"Content-Length: %d\r\n" % len(body), body)

    async def start(
        self, status: int, headers: Mapping[str, str], first: bytes, length: int | None = None
    ) -> None:
        if length is not None:
            await self._head(status, headers, b"Content-Length: %d\r\n" % length, first)
        else:
            self._chunked = True
            await self._head(status, headers, b"Transfer-Encoding: chunked\r\n", _chunk(first))

    async def _head(
        self, status: int, headers: Mapping[str, str], framing: bytes, body: bytes
    ) -> None:
        conn = self._conn
        self._started = True
        conn.write(response_head(status, headers, framing + conn.close_line()) + body)
        await conn.drain()

    async def write(self, chunk: bytes) -> None:
        self.write_nowait(chunk)
        await self._conn.drain()

    async def end(self) -> None:
        if self._chunked:
            self._conn.write(b"0\r\n\r\n")
        await self._conn.drain()

    def write_nowait(self, chunk: bytes) -> None:
        if chunk:
            self._conn.write(_chunk(chunk) if self._chunked else chunk)

    def throttle(self, hooks: tuple[Callable[[], None], Callable[[], None]] | None) -> None:
        self._conn.throttled = hooks


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class FrontConnection(asyncio.Protocol):
    """One client connection while the front serves it."""

    _transport: asyncio.Transport  # from connection_made, before any other call

    def __init__(self, front: Front) -> None:
        self._front = front
        self._loop = front.loop
        self._buffer = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None
        self._paused = False
        self._stalled: asyncio.TimerHandle | None = None
        """Ends the connection, as the client's leaving, if its socket stays full too long."""
        self._reading_paused = False
        self._closing = False
        self._gone = False
        self.throttled: tuple[Callable[[], None], Callable[[], None]] | None = None
        """What stops and restarts the replica writing to this client directly, while the
        client's socket is full."""
        self._waiting_body: tuple[Endpoint, str, int] | None = None
        """The endpoint, id and length (head and body) of a request whose head is in and body
        is not (its timer runs)."""
        self.ended: asyncio.Future[None] | None = None
        """Done when the connection closes, for a drain waiting on it (close_when_idle)."""

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._front.opened(self)
        self._timer = self._loop.call_later(self._front.header_timeout_s, self._idle)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._task is None:
            self._next()
        elif len(self._buffer) > self._front.max_buffer and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone = True
        self._front.closed(self)
        self._cancel_timer()
        if self._stalled is not None:
            self._stalled.cancel()
        if self._task is not None:
            self._task.cancel()  # the client left: vLLM aborts the request when we close ours
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_exception(ConnectionResetError("the client closed the connection"))
        if self.ended is not None and not self.ended.done():
            self.ended.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True
        if self.throttled is not None:
            self.throttled[0]()
        # Reading nothing, it holds its replica's batch slot and KV cache: it gets so long.
        self._stalled = self._loop.call_later(self._front.send_timeout_s, self._transport.abort)

    def resume_writing(self) -> None:
        self._paused = False
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if self.throttled is not None:
            self.throttled[1]()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    # for the exchange
    def write(self, data: bytes) -> None:
        if self._gone or self._transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._transport.write(data)

    async def drain(self) -> None:
        if self._paused and not self._gone:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def close_line(self) -> bytes:
        return b"Connection: close\r\n" if self._closing or self._front.draining else b""

    def close_when_idle(self) -> asyncio.Future[None] | None:
        """Shutdown: close now if no request is in flight, else after its answer. A request
        whose body is still arriving is in flight: served once it is in, or refused at the
        drain's deadline (refuse_upload); its connection's ``ended`` is returned to wait on."""
        self._closing = True
        if self._waiting_body is not None:
            self.ended = self._loop.create_future()
            return self.ended
        if self._task is None:
            self._transport.close()
        return None

    def refuse_upload(self) -> None:
        """The drain's deadline: a request whose body is still arriving gets a 503."""
        if self._waiting_body is not None:
            self._refuse(shutting_down())

    # framing
    def _next(self) -> None:
        """Frames the next request, or hands the connection to aiohttp. Never raises: it runs in
        data_received and at the end of a request's task, where an exception would drop the
        connection unanswered, or leave it hanging."""
        try:
            if self._frame():
                return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            pass  # malformed, or an Upgrade or a CONNECT (llhttp stops at them): aiohttp's
        except Exception:
            log.exception("the front could not frame a request: aiohttp serves the connection")
        # In a context of its own: aiohttp's tasks copy the current one, which may be the task
        # of the previous request, its id (and trace span) with it.
        contextvars.Context().run(self._hand_over)

    def _frame(self) -> bool:
        """Frames the request at the buffer's start and starts serving it, or waits for the
        rest of it (True); False: the request is aiohttp's."""
        buffer = self._buffer
        if self._waiting_body is not None and len(buffer) < self._waiting_body[2]:
            return True  # its head is not parsed again for each piece of its body
        if not buffer.startswith(_POST) and not _POST.startswith(buffer):
            return False  # another method, TLS, garbage: aiohttp answers now, not at the timeout
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            # A line ended by a bare LF (which llhttp refuses) never ends the head as awaited.
            return len(buffer) <= MAX_HEAD_BYTES and buffer.count(b"\n") == buffer.count(b"\r\n")
        if end + 4 > MAX_HEAD_BYTES:
            return False
        front = self._front
        head = RequestHead()
        parser = httptools.HttpRequestParser(head)
        parser.feed_data(bytes(buffer[: end + 4]))
        endpoint = _ENDPOINTS.get(head.url)
        fast = parser.get_method() == b"POST" and parser.get_http_version() == "1.1"
        length = framed_body_length(head.fields, end + 4, front.max_body_bytes) if fast else -1
        if endpoint is None or length <= 0:  # llhttp forgets an empty body's Connection: close
            return False
        total = end + 4 + length
        # Values decoded as aiohttp decodes them: a key or a hint reads the same either way.
        fields = ((n.decode("latin-1"), v.decode(errors="surrogateescape")) for n, v in head.fields)
        headers = CIMultiDictProxy(CIMultiDict(fields))
        if len(buffer) < total:
            if self._waiting_body is None:
                self._cancel_timer()
                self._waiting_body = (endpoint, request_id(headers), total)
                self._timer = self._loop.call_later(front.body_timeout_s, self._body_late)
            return True
        self._cancel_timer()
        self._waiting_body = None
        body = bytes(buffer[end + 4 : total])
        del buffer[:total]
        if not parser.should_keep_alive():
            self._closing = True  # the answer says so, and the connection closes after it
        request = Request(endpoint, headers, body)
        self._task = request.task = self._loop.create_task(self._serve(request))
        return True

    async def _serve(self, request: Request) -> None:
        exchange = FrontExchange(self, request.headers)
        try:
            await self._front.serve(request, exchange)
        except ConnectionResetError:
            self._transport.close()  # the client left, or an answer broke off midway
            return
        except BaseException:
            self._transport.close()
            raise
        finally:
            self._task = None
        if self._closing or self._front.draining:
            self._transport.close()
            return
        if self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
        self._timer = self._loop.call_later(self._front.header_timeout_s, self._idle)
        if self._buffer:
            self._next()

    def _hand_over(self) -> None:
        """aiohttp serves the rest of the connection, from this request's first byte."""
        self._cancel_timer()
        transport = self._transport
        self._front.closed(self)
        handler = self._front.handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._reading_paused:
            transport.resume_reading()
        if self._buffer:
            handler.data_received(bytes(self._buffer))
        self._buffer.clear()

    # timers
    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle(self) -> None:
        """No complete request head within the header timeout of the connection's opening or
        its previous answer: closed, as aiohttp's keep-alive timer does."""
        self._timer = None
        if self._task is None:
            self._transport.close()

    def _body_late(self) -> None:
        """The body did not arrive within the body timeout of its head: a 408."""
        self._refuse(body_late(self._front.body_timeout_s))

    def _refuse(self, error: ApiError) -> None:
        """``error`` answers the request whose body is awaited, and the connection closes
        (what is left of the body cannot be told from a next request)."""
        self._cancel_timer()
        assert self._waiting_body is not None  # both callers answer a body still awaited
        (endpoint, answer_id, _), self._waiting_body = self._waiting_body, None
        self._front.count_error(endpoint.value, error.status)
        framing = b"Content-Length: %d\r\nConnection: close\r\n" % len(body := error.body())
        sent = response_head(error.status, error.answer_headers({REQUEST_ID: answer_id}), framing)
        self._transport.write(sent + body)
        linger(self._transport, self)  # closed at once, the client still sending: a reset


class Front:
    """The listening socket's connections while the front serves them, and what it needs of
    the gateway: how to serve a request, and aiohttp's handler to hand a connection to."""

    def __init__(
        self,
        serve: Callable[[Request, FrontExchange], Awaitable[None]],
        handler: Callable[[], asyncio.Protocol],
        count_error: Callable[[str, int], None],
        *,
        header_timeout_s: float,
        body_timeout_s: float,
        send_timeout_s: float,
        max_body_bytes: int,
        on_open: Callable[[int], None],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.serve = serve
        self.handler = handler
        self.count_error = count_error
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_buffer = max_body_bytes + MAX_HEAD_BYTES
        self._on_open = on_open
        self.draining = False
        self._connections: set[FrontConnection] = set()

    def connection(self) -> FrontConnection:
        return FrontConnection(self)

    def opened(self, conn: FrontConnection) -> None:
        self._connections.add(conn)
        self._on_open(1)

    def closed(self, conn: FrontConnection) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
            self._on_open(-1)

    def pre_shutdown(self) -> list[asyncio.Future[None]]:
        """Keep-alive connections close after their current answer, idle ones now; the futures
        are those of connections whose request's body is still arriving, done as they close."""
        self.draining = True
        ending = [conn.close_when_idle() for conn in list(self._connections)]
        return [ended for ended in ending if ended is not None]

    def refuse_uploads(self) -> None:
        """The drain's deadline: requests whose body is still arriving get a 503."""
        for conn in list(self._connections):
            conn.refuse_upload()
