"""Usage for the streams whose client did not ask for it.

A chat or completions stream reports its usage only when the request sets
``stream_options.include_usage`` (vLLM 0.32: ``include_usage: bool | None = False``), which the
OpenAI SDKs leave out:
such a stream would teach routing nothing (characters per token, how far the prefix index's
belief held) and leave a tenant's token charge at its estimate. The gateway asks the replica
for the usage on the client's behalf and drops that one event from what the client gets, so
the client receives the stream it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.http.request_body import Endpoint, ParsedRequest

_ASKED = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS))
"""Where usage comes only if asked for (a /v1/responses stream always ends with it)."""
_EVENT_END = b"\n\n"
_USAGE = b'"usage":{'
"""Unescaped quotes: never inside a JSON string, so model output cannot fake either mark."""
_NO_CHOICES = b'"choices":[]'
_NOT_ASKED = (None, False)
"""`include_usage` values vLLM reads as no usage (`in` compares by equality: 0 is among them,
as pydantic reads it)."""


def asking_usage(parsed: ParsedRequest) -> bytes | None:
    """The body to send in place of the client's, asking for the stream's usage; None when
    the client's goes as it is (not a chat or completions stream, or the client asked itself).
    `stream_options`, where given, is an object: the body's checks refuse anything else."""
    if not parsed.stream or parsed.endpoint not in _ASKED:
        return None
    options: Mapping[str, Any] | None = parsed.body.get("stream_options")
    if options is None:
        return orjson.dumps({**parsed.body, "stream_options": {"include_usage": True}})
    # Left out, null or false (0 alike), vLLM sends no usage (measured on vLLM 0.32: `{}` gets
    # none; older releases defaulted to true). Anything else goes as sent: vLLM reads it, or
    # answers the client's own 400.
    if options.get("include_usage") not in _NOT_ASKED:
        return None
    # Without include_usage vLLM ignores continuous_usage_stats: asked for the usage, it would
    # put one on every chunk, which the client did not ask for and would not be dropped.
    asked = {k: v for k, v in options.items() if k != "continuous_usage_stats"}
    return orjson.dumps({**parsed.body, "stream_options": {**asked, "include_usage": True}})


class UsageDropped:
    """What the client gets of a stream whose usage the gateway asked for: whole events, less
    the one that carries the usage alone. An event split between two chunks waits for its end
    (no client could read it before); ``rest`` is what is left when the stream stops."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def __call__(self, chunk: bytes) -> bytes:
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(_EVENT_END) + len(_EVENT_END)
        if end < len(_EVENT_END):
            self._partial = data
            return b""
        if end == len(data):  # the usual chunk: whole events, no copy
            whole, self._partial = data, b""
        else:
            whole, self._partial = data[:end], data[end:]
        if _USAGE not in whole:
            return whole
        events = whole.split(_EVENT_END)[:-1]
        return b"".join(e + _EVENT_END for e in events if not _usage_only(e))

    def rest(self) -> bytes:
        rest, self._partial = self._partial, b""
        return rest


def _usage_only(event: bytes) -> bool:
    return event.startswith(b"data: {") and _NO_CHOICES in event and _USAGE in event
