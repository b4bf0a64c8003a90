"""The client's side of one relayed request, whatever serves its connection: the front's
protocol (gateway/http/front.py) or aiohttp (every request the front hands over).

The forwarder answers through this and nothing else: a whole answer with its length in one
write, or a streamed one whose head leaves with its first chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web


class Exchange(Protocol):
    @property
    def headers(self) -> Mapping[str, str]:
        """The client's request headers, names case-insensitive."""

    @property
    def started(self) -> bool:
        """Whether the answer's head has gone out (no other answer is possible then)."""

    async def answer(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """The whole answer, with its length."""

    async def start(
        self, status: int, headers: Mapping[str, str], first: bytes, length: int | None = None
    ) -> None:
        """The head of an answer relayed as it arrives, with its first bytes; ``length`` when
        the whole answer's is known."""

    async def write(self, chunk: bytes) -> None:
        """More of a started answer; waits while the client's socket is full. Raises
        ConnectionResetError when the client has gone."""

    async def end(self) -> None:
        """The end of a started answer."""

    @property
    def direct(self) -> bool:
        """Whether ``write_nowait`` and ``throttle`` work: a relay may then write each chunk
        from the replica connection's callback."""

    def write_nowait(self, chunk: bytes) -> None:
        """More of a started answer, at once; ConnectionResetError when the client has gone."""

    def throttle(self, hooks: tuple[Callable[[], None], Callable[[], None]] | None) -> None:
        """Calls the first of ``hooks`` when the client's socket is full and the second when
        it drains, until called with None."""


class AiohttpExchange:
    """An exchange aiohttp serves, written through its StreamResponse under the send timeout
    (a whole answer too, with its length), which the handler then returns."""

    __slots__ = ("_request", "_send_timeout_s", "response")
    direct = False  # aiohttp's writes are coroutines

    def __init__(self, request: web.Request, send_timeout_s: float) -> None:
        self._request = request
        self._send_timeout_s = send_timeout_s
        self.response: web.StreamResponse | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        return self._request.headers

    @property
    def started(self) -> bool:
        return self.response is not None and self.response.prepared

    async def answer(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        # Written here, not by aiohttp once the handler returns: under the send timeout.
        await self.start(status, headers, body, len(body))
        await self.end()

    async def start(
        self, status: int, headers: Mapping[str, str], first: bytes, length: int | None = None
    ) -> None:
        response = self.response = _HeadWithFirstChunk(status=status, headers=headers)
        if length is not None:
            response.content_length = length
        await response.prepare(self._request)
        await self.write(first)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self._within_send_timeout(self.response.write(chunk))

    async def end(self) -> None:
        assert self.response is not None
        await self._within_send_timeout(self.response.write_eof())

    async def _within_send_timeout(self, writing: Awaitable[None]) -> None:
        # A client that reads nothing holds its replica's batch slot and KV cache: past the
        # send timeout it counts as gone, as on the front's connections.
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await writing
        except TimeoutError:
            if self._request.transport is not None:
                self._request.transport.abort()
            raise ConnectionResetError("the client read nothing within the send timeout") from None

    def write_nowait(self, chunk: bytes) -> None:
        raise NotImplementedError("aiohttp writes only through `write`")

    def throttle(self, hooks: tuple[Callable[[], None], Callable[[], None]] | None) -> None:
        raise NotImplementedError("aiohttp writes only through `write`")


class _HeadWithFirstChunk(web.StreamResponse):
    """Sends the headers together with the first chunk rather than in a packet of their own,
    as aiohttp's own web.Response does: one write fewer before the first token."""

    _send_headers_immediately = False


async def end_with(exchange: Exchange, event: bytes) -> None:
    """Ends a started answer with ``event`` (an SSE error), if the client takes it within a
    second: the gateway is stopping, and an error the client can read beats a cut."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await exchange.write(event)
            await exchange.end()
