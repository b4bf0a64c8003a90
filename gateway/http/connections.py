"""Client connections: how many may be open, and what a malformed request gets back.

aiohttp has no connection limit, and answers HTTP it cannot parse in plain text, logging the
offending bytes (header lines, credentials included). The listening socket is created here
with a protocol factory that counts connections, refuses one over the limit with a 503 in the
OpenAI shape, and hands the others to a request handler whose error answers are OpenAI bodies
and whose log line names the problem's kind, never the bytes.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.http.errors import ApiError, too_many_connections
from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger(__name__)

_FDS_PER_CONNECTION = 2
"""A proxied request holds its client's socket and one to a replica."""
_RESERVED_FDS = 64
"""Listening socket, logs, health probes and scrapes, the policy file."""
_REFUSAL_LOG_EVERY_S = 10.0
_REFUSAL_LINGER_S = 1.0


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
    """One connection too many: a complete 503 answer, then the connection closes.

    Closing at once, with the client's request unread, would make the kernel answer it with
    a reset that can destroy the 503 before the client reads it: the write side is shut
    instead, and what the client sends is discarded until it closes (or a second passes)."""

    def __init__(self, response: bytes) -> None:
        self._response = response
        self._closer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp = cast(asyncio.Transport, transport)  # uvloop's is one, though not a subclass
        tcp.write(self._response)
        if tcp.can_write_eof():
            tcp.write_eof()
        self._closer = asyncio.get_running_loop().call_later(_REFUSAL_LINGER_S, tcp.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closer is not None:
            self._closer.cancel()


def _refusal_bytes(limit: int) -> bytes:
    body = too_many_connections(limit).body()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
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
        self._refusal = _refusal_bytes(limit)
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
            return _Refusal(self._refusal)
        return self.front() if self.front is not None else self.handler()

    def handler(self) -> asyncio.Protocol:
        """aiohttp's handler for a connection (counted open from its connection_made)."""
        return _Handler(self, self._server, loop=self._loop, **self._handler_args)

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
        response = error.response()
        response.force_close()
        return response
