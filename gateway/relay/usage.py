"""The prompt's length and cached part in tokens, as a replica reports them in `usage`.

Read from the raw bytes relayed to the client (a whole body, or the stream chunk that carries
the usage) without parsing the JSON: the figures teach the pool's characters per token, each
replica's true prefill work (for its learned rates) and how far the prefix index can be
believed. vLLM reports cached tokens with --enable-prompt-tokens-details (the launch recipe
sets it).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from router_policies.value import value

_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
"""Chat and completions report `prompt_tokens`; /v1/responses `input_tokens` (its cached
tokens under `input_tokens_details`, as chat's are under `prompt_tokens_details`)."""
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


@value
class PromptUsage:
    prompt_tokens: int
    cached_tokens: int | None


def prompt_usage(data: bytes) -> PromptUsage | None:
    if b'"prompt_tokens"' not in data and b'"input_tokens"' not in data:
        return None
    prompt = _PROMPT_TOKENS.search(data)
    if prompt is None:
        return None
    cached = _CACHED_TOKENS.search(data, prompt.end())
    return PromptUsage(int(prompt.group(1)), int(cached.group(1)) if cached else None)


_USAGE = re.compile(rb'"usage"\s*:\s*(\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\})')
"""A `usage` member whose object is whole. vLLM's nests two levels: the tokens' details, and
in them an image prompt's `multimodal_tokens` per modality."""


def usage_object(data: bytes) -> bytes | None:
    """The last `usage` member's object in ``data``, once whole; None where there is none, or
    it is null, or a read ended inside it (its figures are not all in yet, the last one's
    digits perhaps cut). The last: a Responses answer repeats the request's tools and text
    format before its usage, objects a client may give any member."""
    at = data.rfind(b'"usage"')
    found = _USAGE.match(data, at) if at >= 0 else None
    return None if found is None else found.group(1)


_FINAL_EVENT = re.compile(rb'"choices"\s*:\s*\[\s*\]')
"""A chat or completions stream's last event, the one whose usage counts the whole request."""


def final_usage_part(data: bytes) -> bytes | None:
    """``data`` from a chat or completions stream's final event on, None if it holds none:
    with `continuous_usage_stats` every chunk before it carries one choice's running usage
    (one prompt's of a batch), which would misteach the pool and undercharge a tenant."""
    found = _FINAL_EVENT.search(data)
    return None if found is None else data[found.start() :]


SEAM_BYTES = 512
"""Of a read that ended mid-event, the bytes kept to search again with the next: a `usage`
object (~200 bytes) split across two reads is then found whole."""


class UsageReads:
    """A stream's reads as ``learn`` (true once it read the usage) must see them: a read that
    ended mid-event joined with the next. A replica's writes may split the usage event (a
    Responses stream's `response.completed` repeats the whole output: many TCP segments); read
    by halves, the request was charged its estimate and taught the pool nothing. Reads that
    end at a line end, vLLM's usual, cost one check each."""

    __slots__ = ("_learn", "_tail")

    def __init__(self, learn: Callable[[bytes], bool]) -> None:
        self._learn = learn
        self._tail = b""

    def __call__(self, chunk: bytes) -> None:
        seen = self._tail + chunk if self._tail else chunk
        self._tail = b"" if self._learn(seen) or seen.endswith(b"\n") else seen[-SEAM_BYTES:]
