"""A replica's answer: what vLLM sends, and a non-streaming one read with bounded memory.

vLLM's OpenAI server answers JSON or server-sent events, errors included, and ends a chat or
completions stream with ``data: [DONE]``: anything else (a proxy's HTML error page, a stream
cut short) is a failed answer, not a success to relay.

The gateway holds an answer whole when it can: it then reads the usage and a stored
response's id from it and sends it with its length in one write. An answer longer than
``max_buffered_answer_bytes`` (a runaway replica, a huge error page, logprobs x n) is not
held: what was read goes to the client and the rest follows as it arrives, so each request
holds at most the limit whatever the replica sends.
"""

from __future__ import annotations

import asyncio

import orjson

from gateway.http.exchange import Exchange
from gateway.http.request_body import Endpoint, ParsedRequest
from gateway.relay.upstream import UpstreamResponse
from gateway.relay.upstream_errors import (
    ReplicaDisconnected,
    StreamFailed,
    StreamRefused,
    UpstreamError,
)

SSE = "text/event-stream"
JSON = "application/json"
_OPENAI_TYPES = frozenset((JSON, SSE))
_DONE = b"data: [DONE]"
_DONE_TAIL = len(_DONE) + 4
"""The bytes a chat or completions stream ends with: its marker and the blank line after it
(four bytes at most, with CRLF line ends)."""
_ENDS_WITH_DONE = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS))
"""Streams that end with `data: [DONE]` (a Responses stream ends with its own events)."""

TAIL_BYTES = 64 * 1024
"""Of an answer relayed as it arrives, the last bytes kept for its usage (an OpenAI body ends
with it)."""
FAILURE_BYTES = 64 * 1024
"""Most of a failed attempt's answer kept in case no other replica takes the request: error
bodies are short, and a longer one is replaced by the gateway's own."""
FAILURE_WAIT_S = 2.0
"""Longest wait for a failed attempt's answer: vLLM writes an error body with its head, and
the retry waits on it (a stream's first-token deadline is not running any more)."""


def from_vllm(content_type: str) -> bool:
    return content_type in _OPENAI_TYPES


_OPENING_EVENTS = (b"event: response.created\n", b"event: response.in_progress\n")
"""What a /v1/responses stream sends before the engine has produced anything: vLLM yields
both as the request starts, before its prefill."""


_ERROR_EVENT = b'data: {"error"'
"""How vLLM fails a stream it has started (the engine finished the request with an error): an
event of its own, where a request not streamed gets a 5xx. Model output cannot fake it: in an
event's JSON a quote is escaped."""
_ROLE = b'"delta":{"role"'
"""A chat stream's first chunk, the assistant's role, which vLLM sends before the first
token's chunk or an error event."""


async def first_output(upstream: UpstreamResponse, parsed: ParsedRequest) -> bytes:
    """A stream's first reads, up to its first token: held back from the client, so that a
    replica that dies, stalls or answers vLLM's error event before it is one more failed
    attempt (retried elsewhere), not a broken stream. Held with it: a Responses stream's
    opening events and a chat stream's role chunk, which come before the prefill ends.
    Compressed bytes (a replica that ignored the gateway's Accept-Encoding) cannot be read:
    the first read goes as it came. So does a background response's: vLLM runs one on its
    own, a closed connection or not, and once one replica has it no other is to run it."""
    endpoint = parsed.endpoint
    held = parsed.body.get("background") is not True
    first = await upstream.readany()
    while (
        held
        and first
        and upstream.content_encoding is None
        and (
            not has_first_token(endpoint, first)
            or (endpoint is Endpoint.CHAT and first.count(b"data: ") == 1 and _ROLE in first)
        )
    ):
        more = await upstream.readany()
        if not more:
            break
        first += more
    if not first:
        raise ReplicaDisconnected("stream ended before its first byte")
    if _ERROR_EVENT in first:
        at = first.index(_ERROR_EVENT) + len(b"data: ")
        while (
            b"\n" not in first[at:]
            and len(first) < FAILURE_BYTES
            and (more := await upstream.readany())
        ):
            first += more  # the event's rest: whose fault it is, is in its code
        raise _refusal(first[at:].split(b"\n", 1)[0].strip()) or StreamFailed(
            "answered an error event before its first token"
        )
    return first


def _refusal(event: bytes) -> StreamRefused | None:
    """vLLM's error event when its code says the request is at fault (a 4xx)."""
    try:
        code = orjson.loads(event)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if isinstance(code, int) and 400 <= code < 500:
        return StreamRefused(code, event)
    return None


def has_first_token(endpoint: Endpoint, chunk: bytes) -> bool:
    """Whether a streamed chunk carries output: any chat or completions chunk; a Responses
    one with an event besides the two openings (so the time to it is a time to first token)."""
    if endpoint is not Endpoint.RESPONSES:
        return True
    # Lines that open an event: the text "event: " also comes inside JSON strings (the opening
    # events repeat the request's instructions and tools), a line break never does.
    events = chunk.count(b"\nevent: ") + chunk.startswith(b"event: ")
    return events > sum(map(chunk.count, _OPENING_EVENTS))


_RESPONSES_ENDS = (
    b"event: response.completed\n",
    b"event: response.incomplete\n",
    b"event: response.failed\n",
    b"event: error\n",
)
"""The events a Responses stream ends with (no `data: [DONE]` follows them). The line break is
a real one, which JSON never leaves in a string: model output cannot fake one."""
_END_MARK_BYTES = max(map(len, _RESPONSES_ENDS))
"""How much of the chunk before to read with each chunk: an end event's line may come split."""
_TAIL = max(_END_MARK_BYTES, _DONE_TAIL)


def _responses_ended(window: bytes) -> bool:
    """Whether a Responses stream's ``window`` of bytes holds its final event."""
    return any(end in window for end in _RESPONSES_ENDS)


class StreamEnd:
    """Whether a relayed stream reached its end, from a rolling tail of its bytes: a replica's
    writes may split the end marker over any number of reads (a byte each, at worst), which a
    window of the last two reads would take for a stream cut short."""

    __slots__ = ("_ended", "_event", "_responses", "_tail", "_whole", "errored")

    def __init__(self, endpoint: Endpoint, raw: bool = False) -> None:
        self._responses = endpoint is Endpoint.RESPONSES and not raw
        self._whole = raw or endpoint not in _ENDS_WITH_DONE
        """Whether any clean close is whole: a stream with no end marker to wait for, or one
        whose bytes are compressed (``raw``), where no marker can be read."""
        self._ended = False
        self._tail = b""
        """At least the stream's last _TAIL bytes (all of a read that long, kept, not copied)."""
        self.errored = False
        """Whether the stream carried vLLM's error event: the request failed, though the stream
        ends as any other."""
        self._event = b""
        """The error event's bytes from its start, read up to its line's end."""

    def feed(self, chunk: bytes) -> None:
        """The next read of the stream, as it came."""
        tail = self._tail
        if self._responses and not self._ended:
            seam = tail[1 - _END_MARK_BYTES :] + chunk[: _END_MARK_BYTES - 1]
            self._ended = _responses_ended(chunk) or _responses_ended(seam)
        elif not self._whole and not self.errored:
            at = chunk.find(_ERROR_EVENT)
            if at >= 0:
                self.errored, self._event = True, chunk[at : at + FAILURE_BYTES]
            elif not tail.endswith(b"\n"):
                # Across the seam only when a read ended mid-line: the marker holds no line break.
                seam = tail[1 - len(_ERROR_EVENT) :] + chunk[: len(_ERROR_EVENT) - 1]
                if (at := seam.find(_ERROR_EVENT)) >= 0:
                    self.errored = True
                    self._event = seam[at:] + chunk[len(_ERROR_EVENT) - 1 : FAILURE_BYTES]
        elif self.errored and b"\n" not in self._event and len(self._event) < FAILURE_BYTES:
            self._event += chunk[:FAILURE_BYTES]
        self._tail = chunk if len(chunk) >= _TAIL else tail[len(chunk) - _TAIL :] + chunk

    @property
    def refusal_status(self) -> int | None:
        """The error event's code where it says the request is at fault (a 4xx), not the
        replica; None for any other stream."""
        if not self.errored:
            return None
        refusal = _refusal(self._event.split(b"\n", 1)[0].removeprefix(b"data: ").strip())
        return refusal.status if refusal is not None else None

    @property
    def refused(self) -> bool:
        return self.refusal_status is not None

    @property
    def ended(self) -> bool:
        """Whether the stream so far holds its end: a Responses stream's final event, a chat
        or completions stream's `data: [DONE]` as its last event."""
        if self._responses:
            return self._ended
        # Only line ends after it: inside a JSON string the marker is followed by a quote.
        return self._whole or self._tail[-_TAIL:].rstrip(b"\r\n").endswith(_DONE)


async def read_head(upstream: UpstreamResponse, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of the answer (a little more: the last read's), and whether that
    is all of it."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await upstream.readany()
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts), False


async def relay_rest(exchange: Exchange, upstream: UpstreamResponse) -> bytes:
    """Writes the rest of the answer as it arrives (the client's pace holds the replica's:
    each write waits for the socket to drain); its last TAIL_BYTES."""
    tail = b""
    while chunk := await upstream.readany():
        await exchange.write(chunk)
        tail = (tail + chunk)[-TAIL_BYTES:]
    return tail


async def drain(upstream: UpstreamResponse) -> bytes | None:
    """A failed attempt's answer; None when it is longer than FAILURE_BYTES, broke, or was
    not in within FAILURE_WAIT_S."""
    try:
        async with asyncio.timeout(FAILURE_WAIT_S):
            body, whole = await read_head(upstream, FAILURE_BYTES)
    except (UpstreamError, TimeoutError):
        whole = False
    if not whole:
        upstream.close()  # not worth reading to the end to keep the connection
        return None
    upstream.release()
    return body
