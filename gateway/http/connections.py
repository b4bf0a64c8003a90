"""Client connections: how many may be open, which request heads the front frames, what a
malformed request gets back, and the head of an answer written on the transport.

aiohttp has no connection limit, and answers HTTP it cannot parse in plain text, logging the
offending bytes (header lines, credentials included). The listening socket is created here
with a protocol factory that counts connections, refuses one over the limit with a 503 in the
OpenAI shape, and hands the others to a request handler whose error answers are OpenAI bodies
and whose log line names the problem's kind, never the bytes. Its limits on request heads are
set here too, and the front (gateway/http/front.py) hands it every head over them or asking
for what only aiohttp does: a head gets the same answer whoever frames it, however TCP splits
it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.headers import REQUEST_ID
from gateway.http.errors import ApiError, too_many_connections
from gateway.http.request_ids import request_id
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger(__name__)

_FDS_PER_CONNECTION = 2
"""A proxied request holds its client's socket and one to a replica."""
_RESERVED_FDS = 64
"""Listening socket, logs, health probes and scrapes, the policy file."""
_REFUSAL_LOG_EVERY_S = 10.0
_REFUSAL_LINGER_S = 1.0
MAX_FIELD_BYTES = 8190
"""The most bytes of a request header field, name and value together (aiohttp's default)."""
MAX_FIELDS = 128
"""The most header fields of a request (aiohttp's default)."""
MAX_HEAD_BYTES = 16 * 1024
"""The longest request head the front frames; a longer one, of fields within the limits
above, aiohttp serves."""
_LIMIT_DIGITS = 18
"""Digits of the longest Content-Length read as a number: any body limit has fewer."""
_HANDED_OVER = frozenset((b"expect", b"transfer-encoding", b"content-encoding"))
"""Request headers that send a request to aiohttp: what they ask for is its to do."""
_SINGLETONS = frozenset((
    b"host", b"content-type", b"user-agent", b"content-location", b"content-range", b"etag",
    b"max-forwards", b"server",
))  # fmt: skip
"""Fields aiohttp refuses twice (its parser's SINGLETON_HEADERS, Content-Length and
Transfer-Encoding aside): a request with two, or with no Host, is aiohttp's to answer 400."""


class RequestHead:
    """llhttp's callbacks for one request head."""

    __slots__ = ("fields", "url")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Trailing white space stripped, as aiohttp strips it: a key, an id or a hint reads
        # the same whichever side serves the request (llhttp keeps it).
        self.fields.append((name, value.rstrip(b" \t")))


def framed_body_length(fields: list[tuple[bytes, bytes]], head_bytes: int, limit: int) -> int:
    """The body's length when the front may frame a request of these header fields, in a head
    of ``head_bytes`` (``limit``: the body limit), else -1: aiohttp answers it, as it would on
    a connection it serves."""
    if len(fields) > MAX_FIELDS or (
        head_bytes > MAX_FIELD_BYTES  # else no field can be over it: the usual head, not read
        and any(len(name) + len(value) > MAX_FIELD_BYTES for name, value in fields)
    ):
        return -1
    length = -1
    seen: set[bytes] = set()
    for name, value in fields:
        lower = name.lower()
        if lower == b"content-length":
            # Longer than the limit's digits: over it (and int() refuses 4,300 digits and more).
            if length >= 0 or not value.isdigit() or len(value) > _LIMIT_DIGITS:
                return -1
            length = int(value)
        elif lower in _HANDED_OVER:
            return -1
        elif lower in _SINGLETONS:
            if lower in seen:
                return -1
            seen.add(lower)
    return length if length <= limit and b"host" in seen else -1


_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


class _Date:
    """The Date header, formatted once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._line = f"Date: {formatdate(second, usegmt=True)}\r\n".encode()
        return self._line


_DATE = _Date()


def response_head(status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
    """Status line and headers; ``framing`` is the length or chunking line(s)."""
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    lines += [f"{k}: {v}\r\n".encode("latin-1", "replace") for k, v in headers.items()]
    lines.append(_DATE.line())
    lines.append(framing)
    lines.append(b"\r\n")
    return b"".join(lines)


def connection_limit(wanted: int) -> int:
    """`wanted`, lowered to what the open-file limit allows (raised to its hard cap first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    allowed = max((soft - _RESERVED_FDS) // _FDS_PER_CONNECTION, 1)
    if allowed < wanted:
        log.warning(
            "GATEWAY_MAX_CONNECTIONS=%d lowered to %d: the open-file limit is %d",
            wanted, allowed, soft,
        )  # fmt: skip
    return min(wanted, allowed)


class _Refusal(asyncio.Protocol):
    """One connection too many: a complete 503 answer, then the connection closes (linger)."""

    def __init__(self, response: bytes) -> None:
        self._response = response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass
        tcp.write(self._response)
        linger(tcp)


class _Discarding(asyncio.Protocol):
    """A connection's last second: what the client sends is read and dropped."""

    def __init__(self, then: asyncio.BaseProtocol | None) -> None:
        self._then = then

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._then is not None:
            self._then.connection_lost(exc)


def linger(transport: asyncio.Transport, protocol: asyncio.BaseProtocol | None = None) -> None:
    """Closes a connection whose last answer is written, the client's request perhaps unread.

    Closing at once, with bytes unread, would make the kernel answer them with a reset that
    can destroy the answer before the client reads it: the write side is shut instead, and
    what the client sends is discarded until it closes (or a second passes). ``protocol``, the
    connection's until now, is told when it is lost."""
    transport.set_protocol(_Discarding(protocol))
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(_REFUSAL_LINGER_S, transport.close)


def _refusal_bytes(body: bytes) -> bytes:
    """The 503 with its own request id, as every answer has."""
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n"
        f"{REQUEST_ID}: {request_id({})}\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGate:
    """The listening socket's protocol factory."""

    def __init__(
        self, server: web.Server, limit: int, metrics: GatewayMetrics, **handler_args: Any
    ) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._handler_args = handler_args
        self.limit = limit
        self.open = 0
        self._refusal = too_many_connections(limit).body()
        self._refused = metrics.connections_refused
        self._refused_since_log = 0
        self._last_log = float("-inf")
        self.front: Callable[[], asyncio.Protocol] | None = None
        """Serves new connections when set (gateway/http/front.py), handing them to aiohttp's
        handler (``handler``) at their first request it does not take."""
        metrics.connections.set_function(lambda: self.open)

    def __call__(self) -> asyncio.BaseProtocol:
        if self.open >= self.limit:
            self._refused.inc()
            self._log_refusal()
            return _Refusal(_refusal_bytes(self._refusal))
        return self.front() if self.front is not None else self.handler()

    def handler(self) -> asyncio.Protocol:
        """aiohttp's handler for a connection (counted open from its connection_made)."""
        return _Handler(
            self, self._server, loop=self._loop, max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_FIELDS, **self._handler_args,
        )  # fmt: skip

    def count(self, change: int) -> None:
        """A connection the front serves opened (+1) or closed or was handed over (-1)."""
        self.open += change

    def _log_refusal(self) -> None:
        # A flood of connections must not become a flood of log lines.
        self._refused_since_log += 1
        now = time.monotonic()
        if now - self._last_log >= _REFUSAL_LOG_EVERY_S:
            log.warning(
                "refused %d client connections: %d open, GATEWAY_MAX_CONNECTIONS is %d",
                self._refused_since_log, self.open, self.limit,
            )  # fmt: skip
            self._refused_since_log = 0
            self._last_log = now


class _Handler(RequestHandler):
    def __init__(self, gate: ConnectionGate, server: web.Server, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._gate = gate
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._gate.open += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._gate.open -= 1
            self._counted = False
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # aiohttp's private state (3.10-3.14), read with defaults: another version without it
        # keeps aiohttp's own behaviour.
        closing = getattr(self, "_close", False) and not getattr(self, "_force_close", True)
        if closing and getattr(self, "_request_in_progress", False):
            # Shutdown's close() makes aiohttp drop all that arrives, the rest of the body of
            # the request in flight too, which would end in a 408: that much is let in (a
            # request after it is parsed but not served, as close() intends).
            self._close = False
            try:
                super().data_received(data)
            finally:
                self._close = True
        else:
            super().data_received(data)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or, never expected, an unhandled error)."""
        if request.writer.output_size > 0 or isinstance(exc, ConnectionError):
            # The client is gone, or a response has started: no answer is possible.
            raise ConnectionError("no error answer is possible on this connection")
        # The exception's text may quote the offending bytes (a header line): only its kind.
        kind = type(exc).__name__ if exc is not None else "error"
        log.info("malformed request from %s answered %d (%s)", request.remote, status, kind)
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        error = ApiError(
            status,
            f"The request could not be processed: {phrase}.",
            type_="invalid_request_error" if status < 500 else "server_error",
            code=phrase.lower().replace(" ", "_").replace("-", "_"),
        )
        response = error.response({REQUEST_ID: request_id(request.headers)})
        response.force_close()
        return response
