"""Request features for routing: a chained block fingerprint of the canonical prompt.

The canonical text is the messages in order, as the chat template renders them: the system and
developer messages that open the conversation (and tool definitions) are its shared lead, so
that requests sharing a system prompt and earlier turns share a fingerprint prefix. Each
block's digest is seeded by the previous one, so a digest identifies the whole prefix up to
and including its block; the chain is seeded by the model name (and cache_salt), because
replicas never share KV cache across models or salts.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash

from router_policies.block_layout import BlockLayout
from router_policies.conversation import responses_view
from router_policies.value import value

_ROLE_SEP = b"\x1f"
_MSG_END = b"\x1e"
LEADING_ROLES = frozenset(("system", "developer"))
"""Roles whose messages form the shared lead where they open the conversation (before its first
message of another role); later ones are turns, in place."""


@value
class RequestFeatures:
    """What the router knows of a request: computed once, before any decision."""

    model: str
    block_hashes: tuple[int, ...]
    """Chained digests of the fingerprinted blocks (the last one may be partial)."""
    hashed_bytes: int
    """How many bytes of canonical text the blocks cover (the prompt, capped)."""
    home_block: int = 0
    """Index of the block whose digest keys the cold-start home: the last full block of the
    system prompt, so prompts that only share a boilerplate opening get different homes."""
    lead_bytes: int = 0
    """Bytes of the shared lead (system and developer messages, tools), capped like the hash."""
    token_keys: tuple[int, ...] = ()
    """Keys of the prompt's whole token blocks (router_policies/engine_blocks.py), where it was
    tokenized to be matched against replicas' KV-cache events; empty otherwise."""
    prompt_tokens: int = 0
    """The prompt's length in tokens, where it was tokenized (0 otherwise)."""
    session: str = ""
    """The conversation the client named (router_policies/sessions.py); "" for none."""
    ttft_objective_s: float | None = None
    """The request's own TTFT objective, where the client set one (it replaces the pool's)."""
    priority: int = 0
    """The client's priority class: higher leaves a saturated pool's queue first; below 0 is
    sheddable, refused at once when the pool is saturated rather than queued."""
    plain: bool = True
    """Whether the fingerprinted text is the prompt's own words alone (CanonicalPrompt.plain)."""

    @property
    def home_key(self) -> int:
        """Key of the prompt's cold-start home (the chain digest identifies the whole prefix)."""
        if not self.block_hashes:
            return _model_seed(self.model, "")
        return self.block_hashes[min(self.home_block, len(self.block_hashes) - 1)]


@functools.lru_cache(maxsize=1024)
def load_only(model: str) -> RequestFeatures:
    """A request routed by load alone: nothing to match. The features are immutable, so one
    per model serves every such request (a frozen instance costs ~1.5 us to build)."""
    return RequestFeatures(model, (), 0)


def _model_seed(model: str, salt: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{model}\x00{salt}".encode())


def content_bytes(content: Any) -> bytes:
    """A message's content as the bytes routing reads: a string and the same text as text
    parts alike (chat's, and /v1/responses' input_text as the conversation view writes it);
    any other part by its canonical JSON. Parts are joined with a newline, as vLLM's string
    content format joins text parts: parts ["A", "B"] are the engine prompt of the string
    "A\\nB", not of "AB"."""
    if isinstance(content, str):
        return content.encode()
    if content is None:
        return b""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")).encode())
            else:
                parts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS))
        return b"\n".join(parts)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)


def _message_bytes(message: Mapping[str, Any]) -> bytes:
    role = str(message.get("role", "")).encode()
    text = role + _ROLE_SEP + content_bytes(message.get("content"))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        # The chat template writes an assistant's calls into the prompt: two tool loops that
        # called differently hold different blocks from that turn on.
        text += _ROLE_SEP + orjson.dumps(normal_calls(tool_calls), option=orjson.OPT_SORT_KEYS)
    return text + _MSG_END


def normal_calls(tool_calls: Any) -> Any:
    """The calls with each ``function.arguments`` string re-dumped compactly, its keys in their
    order. vLLM parses the arguments before the template renders them (tojson), so their
    whitespace never reaches the engine's prompt, while their key order does. A string (not
    the parsed value) goes back: the calls are dumped with sorted keys, which would hide a
    change of order. Arguments that do not parse are kept as sent."""
    if not isinstance(tool_calls, list):
        return tool_calls
    return [_normal_call(call) for call in tool_calls]


def _normal_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    arguments: str = function["arguments"]
    try:
        compact = orjson.dumps(orjson.loads(arguments)).decode()
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # dumps nests less deep than loads
        return call
    return {**call, "function": {**function, "arguments": compact}}


@value
class CanonicalPrompt:
    text: bytes
    lead_bytes: int = 0
    """Length of the shared lead: system and developer messages and tool definitions."""
    plain: bool = True
    """Whether the text is the prompt's own words alone: not an image's, audio's or file's JSON
    (base64, its size nothing like its tokens), token ids, nor the first of a batch of prompts.
    Only then does its length against the prompt's tokens tell the characters per token."""


def canonical_chat(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> CanonicalPrompt:
    """The messages in order, the tools after the opening system and developer messages (the
    lead). A system or developer message later in the conversation (an app's RAG context or
    agent step) stays in place: the template renders it there, so moving it ahead of the turns
    would leave the request sharing no block of its own history."""
    opening = next(
        (i for i, m in enumerate(messages) if m.get("role") not in LEADING_ROLES), len(messages)
    )
    chunks = [_message_bytes(m) for m in messages[:opening]]
    if tools:
        chunks.append(b"tools" + _ROLE_SEP + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS))
    lead = sum(map(len, chunks))
    chunks.extend(_message_bytes(m) for m in messages[opening:])
    return CanonicalPrompt(b"".join(chunks), lead, not any(map(_has_media, messages)))


def _has_media(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and not all(
        isinstance(part, Mapping) and part.get("type") == "text" for part in content
    )


def canonical_prompt(prompt: Any) -> CanonicalPrompt:
    """/v1/completions prompt: a string, a list of strings, or token ids (no lead to find)."""
    if isinstance(prompt, str):
        return CanonicalPrompt(prompt.encode())
    return CanonicalPrompt(orjson.dumps(prompt), plain=False)


def canonical_responses(body: Mapping[str, Any]) -> CanonicalPrompt:
    """/v1/responses, read as the chat it stands for (router_policies/conversation.py), so a
    conversation fingerprints alike whichever of the two APIs carries it."""
    return canonical_chat(responses_view(body), body.get("tools"))


def block_hashes(text: bytes, seed: int, layout: BlockLayout, max_blocks: int) -> tuple[int, ...]:
    digest = xxhash.xxh3_64_intdigest
    end = layout.end(max_blocks)
    if len(text) > end:
        text = text[:end]
    end = len(text)
    per_size = layout.doubling or max_blocks
    hashes: list[int] = []
    append = hashes.append
    prev = seed
    start, step = 0, layout.block_bytes
    while start < end:
        stop = start + step * per_size
        for block in range(start, min(stop, end), step):
            prev = digest(text[block : block + step], prev)
            append(prev)
        start, step = stop, step * 2
    return tuple(hashes)


def fingerprint(
    model: str,
    prompt: CanonicalPrompt | bytes,
    layout: BlockLayout,
    max_blocks: int,
    salt: str = "",
) -> RequestFeatures:
    if isinstance(prompt, bytes):
        prompt = CanonicalPrompt(prompt)
    text = prompt.text
    seed = _model_seed(model, salt)
    hashes = block_hashes(text, seed, layout, max_blocks)
    hashed = min(len(text), layout.end(max_blocks))
    lead = min(prompt.lead_bytes, hashed)
    home_block = max(layout.blocks_within(lead) - 1, 0)
    return RequestFeatures(model, hashes, hashed, home_block, lead, plain=prompt.plain)
