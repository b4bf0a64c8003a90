"""Usage for the streams whose client did not ask for it.

A chat or completions stream reports its usage only when the request sets
``stream_options.include_usage`` (vLLM 0.32: ``include_usage: bool | None = False``), which the
OpenAI SDKs leave out:
such a stream would teach routing nothing (characters per token, how far the prefix index's
belief held) and leave a tenant's token charge at its estimate. The gateway asks the replica
for the usage on the client's behalf and drops that one event from what the client gets, and
the `"usage":null` some servers then put on each of the others (vLLM 0.32 omits it; OpenAI's
API sends it), so the client receives the stream it asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.http.request_body import Endpoint, ParsedRequest, with_member

_ASKED = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS))
"""Where usage comes only if asked for (a /v1/responses stream always ends with it)."""
_ENDS_WHOLE = (b"\n\n", b"\r\n\r\n")
"""How a read of whole events ends, vLLM's and with CRLF line ends."""
_LINE_END_PAIRS = (b"\n\n", b"\r\r", b"\n\r")
"""An event ends at a blank line: two line ends in a row (SSE's are CRLF, LF and CR). Every
blank line holds one of these pairs, and nothing else does."""
_BLANK_LINE = re.compile(rb"\n\n|[\r\n]\r\n?")
"""A blank line whole (its second line end a CRLF where one follows)."""
USAGE_EVENT_MAX_BYTES = 16 * 1024
"""An event longer than this is not the usage one (a few hundred bytes: ids, the model's name,
token counts) and goes to the client as it comes: what a stream holds back stays this small."""
_USAGE = b'"usage":{'
"""Unescaped quotes: never inside a JSON string, so model output cannot fake these marks."""
_NO_CHOICES = b'"choices":[]'
_NULL_USAGE = b',"usage":null'
"""What some servers of vLLM's API put on each chunk but the usage one once the usage is asked
for (compact JSON, after the choices): the client did not ask for it, so it does not get it."""
_STRADDLE = len(_NULL_USAGE) - 1
_NOT_ASKED = (None, False)
"""`include_usage` values vLLM reads as no usage (`in` compares by equality: 0 is among them,
as pydantic reads it)."""
_FALSE_WORDS = frozenset(("0", "off", "f", "false", "n", "no"))
"""The strings pydantic's lax booleans read as false, in any case: vLLM takes `"false"` as no
usage, and a stream that went uncounted would escape its tenant's token limit."""


def asking_usage(parsed: ParsedRequest) -> bytes | None:
    """The body to send in place of the client's, asking for the stream's usage; None when
    the client's goes as it is (not a chat or completions stream, or the client asked itself).
    `stream_options`, where given, is an object: the body's checks refuse anything else."""
    if not parsed.stream or parsed.endpoint not in _ASKED:
        return None
    options: Mapping[str, Any] | None = parsed.body.get("stream_options")
    if options is None:
        return with_member(parsed.raw, "stream_options", {"include_usage": True})
    # Left out, null or false (0 alike), vLLM sends no usage (measured on vLLM 0.32: `{}` gets
    # none; older releases defaulted to true). Anything else goes as sent: vLLM reads it, or
    # answers the client's own 400.
    include = options.get("include_usage")
    if include not in _NOT_ASKED and not (
        isinstance(include, str) and include.lower() in _FALSE_WORDS
    ):
        return None
    # Without include_usage vLLM ignores continuous_usage_stats: asked for the usage, it would
    # put one on every chunk, which the client did not ask for and would not be dropped.
    asked = {k: v for k, v in options.items() if k != "continuous_usage_stats"}
    return with_member(parsed.raw, "stream_options", {**asked, "include_usage": True})


class UsageDropped:
    """What the client gets of a stream whose usage the gateway asked for: whole events, less
    the one that carries the usage alone and the `"usage":null` a server may put on the others.
    An event split between two reads waits for its end (no client could read it before),
    unless it outgrows USAGE_EVENT_MAX_BYTES; ``rest`` is what is held when the stream stops.
    Each read's bytes are looked through a bounded number of times, however they are split."""

    __slots__ = ("_held", "_passing")

    def __init__(self) -> None:
        self._held = bytearray()
        """The current event's bytes not yet shown: all of it, or while ``_passing``, the last
        few (a `"usage":null` may straddle two reads)."""
        self._passing = False
        """Whether the current event is too long to be the usage one: shown as it comes."""

    def __call__(self, chunk: bytes) -> bytes:
        if not self._held and not self._passing and chunk.endswith(_ENDS_WHOLE):
            return _shown(chunk)  # the usual read: whole events, nothing held
        held = self._held
        seam = bytes(held[-2:])  # an event's end may straddle the reads
        if self._passing:
            end = _first_end(chunk, seam)
            if end < 0:
                return self._pass_on(chunk)
            held += chunk[:end]
            shown = bytes(held).replace(_NULL_USAGE, b"")  # the long event's end: no usage
            held.clear()
            self._passing = False
            return shown + self(chunk[end:]) if end < len(chunk) else shown
        end = _last_end(chunk, seam)
        if end < 0:
            held += chunk
            return self._pass_on(b"") if len(held) > USAGE_EVENT_MAX_BYTES else b""
        held += chunk[:end]
        shown = _shown(bytes(held))
        held[:] = chunk[end:]
        if len(held) > USAGE_EVENT_MAX_BYTES:
            shown += self._pass_on(b"")
        return shown

    def rest(self) -> bytes:
        rest = bytes(self._held).replace(_NULL_USAGE, b"")
        self._held.clear()
        self._passing = False
        return rest

    def _pass_on(self, chunk: bytes) -> bytes:
        """All but the last few bytes of the over-long event so far, and ``chunk``."""
        self._passing = True
        data = (bytes(self._held) + chunk).replace(_NULL_USAGE, b"")
        self._held[:] = data[-_STRADDLE:]
        return data[:-_STRADDLE]


class WholeEvents:
    """A stream as the client gets it where nothing is dropped: in whole events. An event split
    between two reads waits for its end, which no client could read before it anyway, so a
    stream that breaks mid-event leaves no half of one on the wire for the error event to be
    glued onto (an SDK would read the two as one event of broken JSON, not as the error). An
    event longer than USAGE_EVENT_MAX_BYTES, and bytes the replica compressed (``raw``), go
    as they come."""

    __slots__ = ("_held", "_raw")

    def __init__(self, raw: bool = False) -> None:
        self._held = b""
        self._raw = raw

    def __call__(self, chunk: bytes) -> bytes:
        held = self._held
        if self._raw or (not held and chunk.endswith(_ENDS_WHOLE)):
            return chunk  # the usual read: whole events
        end = _last_end(chunk, held[-2:])
        if end < 0:
            self._held = held + chunk
            return self.rest() if len(self._held) > USAGE_EVENT_MAX_BYTES else b""
        self._held = chunk[end:]
        return held + chunk[:end]

    def rest(self) -> bytes:
        rest, self._held = self._held, b""
        return rest


def _shown(events: bytes) -> bytes:
    """Whole events as the client gets them."""
    if _USAGE in events:
        events = _without_usage(events)
    return events.replace(_NULL_USAGE, b"")  # the same object where there is none: no copy


def _without_usage(events: bytes) -> bytes:
    kept: list[bytes] = []
    start = 0
    for blank in _BLANK_LINE.finditer(events):
        event = events[start : blank.end()]
        start = blank.end()
        body = event.lstrip(b"\r\n")  # after an extra blank line
        kept.append(event[: len(event) - len(body)] if _usage_only(body) else event)
    kept.append(events[start:])
    return b"".join(kept)


def _usage_only(event: bytes) -> bool:
    return event.startswith(b"data: {") and _NO_CHOICES in event and _USAGE in event


def _last_end(chunk: bytes, seam: bytes) -> int:
    """Where in ``chunk`` the last whole event ends, ``seam`` the two bytes before it; -1 where
    none does."""
    stop = _unsure(chunk)
    at = max(chunk.rfind(pair, 0, stop) for pair in _LINE_END_PAIRS)
    return _after(chunk, at) if at >= 0 else _across(chunk, seam)


def _first_end(chunk: bytes, seam: bytes) -> int:
    """Where in ``chunk`` the first event ends, ``seam`` the two bytes before it; -1 where none
    does."""
    across = _across(chunk, seam)
    if across >= 0:
        return across  # ends at 2 at most, before any that lies within ``chunk``
    stop = _unsure(chunk)
    found = [at for at in (chunk.find(pair, 0, stop) for pair in _LINE_END_PAIRS) if at >= 0]
    return _after(chunk, min(found)) if found else -1


def _unsure(chunk: bytes) -> int:
    """Where to stop looking for ends: before a read's last CR that follows an LF, the first
    half, it may be, of a CRLF whose LF has yet to come (cut there, the LF would open the next
    event, and be dropped with it)."""
    return len(chunk) - 1 if chunk.endswith(b"\n\r") else len(chunk)


def _across(chunk: bytes, seam: bytes) -> int:
    """Where in ``chunk`` a blank line ends that began in ``seam``; -1 where none does."""
    if seam == b"\n\r":  # held back by _unsure: ended there, or with an LF to come
        return 1 if chunk[:1] == b"\n" else 0
    pair = seam[-1:] + chunk[:1]
    if pair not in _LINE_END_PAIRS or (pair == b"\n\r" and len(chunk) == 1):
        return -1
    return 2 if chunk[:2] == b"\r\n" else 1


def _after(chunk: bytes, at: int) -> int:
    """The end of the blank line whose pair of line ends starts at ``at`` (one more byte where
    the second is a CR and its LF follows)."""
    at += 2
    return at + 1 if chunk[at - 1 : at + 1] == b"\r\n" else at
