"""Parsing and checking a request body once, up front, into what routing needs.

Everything the gateway itself reads from a body is checked here, so that no input, however
odd, reaches the routing code in a shape it does not expect: the answer is a 400 naming the
field, never a 500.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from typing import Any

import orjson

from gateway.http.errors import ApiError, bad_request
from replica.openai_api import json_body
from router_policies.fingerprint import (
    CanonicalPrompt,
    canonical_chat,
    canonical_prompt,
    canonical_responses,
)
from router_policies.value import value


class Endpoint(StrEnum):
    """Every POST path the gateway forwards, spelled as vLLM's OpenAI server serves it."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"
    EMBEDDINGS = "/v1/embeddings"
    SCORE = "/v1/score"
    RERANK = "/v1/rerank"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"

    @property
    def prefix_routed(self) -> bool:
        """Generation reads the prompt's KV cache: route by prefix. The others (pooling
        models, the tokenizer) go by load alone: a prompt they see once caches nothing."""
        return self in _PREFIX_ROUTED

    @property
    def model_optional(self) -> bool:
        """vLLM serves its one model when the body names none (the tokenizer endpoints)."""
        return self in (Endpoint.TOKENIZE, Endpoint.DETOKENIZE)


_PREFIX_ROUTED = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES))


@value
class ParsedRequest:
    endpoint: Endpoint
    raw: bytes
    """Forwarded unchanged: the replica sees exactly what the client sent."""
    body: dict[str, Any]
    model: str
    """The model (or LoRA adapter, or tier) named; "" where the endpoint lets it be left out."""
    stream: bool

    def canonical_text(self) -> CanonicalPrompt:
        body = self.body
        if self.endpoint is Endpoint.CHAT:
            return canonical_chat(body["messages"], body.get("tools"))
        if self.endpoint is Endpoint.RESPONSES:
            return canonical_responses(body)
        if self.endpoint is Endpoint.COMPLETIONS:
            prompt = body["prompt"]
            # A batch of prompts is fingerprinted on its first one: the replica prefills them
            # all, but a client's batch shares its opening far more often than not.
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
                first = canonical_prompt(prompt[0])
                return first if len(prompt) == 1 else replace(first, plain=False)
            return canonical_prompt(prompt)
        return CanonicalPrompt(b"")

    @property
    def previous_response_id(self) -> str | None:
        value = self.body.get("previous_response_id")
        return value if self.endpoint is Endpoint.RESPONSES and isinstance(value, str) else None

    @property
    def cache_salt(self) -> str:
        salt = self.body.get("cache_salt")
        return salt if isinstance(salt, str) else ""


def with_member(raw: bytes, name: str, value: object) -> bytes:
    """The JSON object ``raw`` byte for byte (a number past 64 bits or a float's spelling would
    not survive a parse and a dump), with ``name`` set to ``value`` as its last member: JSON's
    parsers, Python's that vLLM reads a body with among them, keep a repeated key's last."""
    end = raw.rstrip().rindex(b"}")  # an object: parse_request saw it
    return b"%s,%s:%s}" % (raw[:end], orjson.dumps(name), orjson.dumps(value))


def parse_request(endpoint: Endpoint, raw: bytes, max_depth: int = 64) -> ParsedRequest:
    try:
        body = json_body(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise too_deeply_nested(max_depth) from None  # orjson's own limit, at 1024 levels
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_depth(body, raw, max_depth)
    model = body.get("model")
    if model is None and endpoint.model_optional:
        model = ""
    elif not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string.", param="model")
    _CHECKS[endpoint](body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        if stream is not None:
            raise bad_request("'stream' must be a boolean.", param="stream")
        stream = False  # vLLM's `stream: Optional[bool] = False`, as OpenAI's: null is false
    _check_optional(body, "stream_options", dict, "an object")
    _check_optional(body, "cache_salt", str, "a string")
    _check_optional(body, "response_format", dict, "an object")
    # A completion of 0 tokens scores its prompt (`echo` with `logprobs`): vLLM serves it there,
    # and judges the rest of the combination itself.
    least = 0 if endpoint is Endpoint.COMPLETIONS else 1
    _check_int(body, "max_tokens", least, 2**31)
    _check_int(body, "max_completion_tokens", 1, 2**31)
    _check_int(body, "n", 1, 128)
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad_request(f"'{name}' must be a number.", param=name)
    return ParsedRequest(endpoint, raw, body, model, stream)


def _check_chat(body: dict[str, Any]) -> None:
    _check_messages(body.get("messages"))
    _check_optional(body, "tools", list, "an array")


def _check_completion(body: dict[str, Any]) -> None:
    _check_prompt(body.get("prompt"))
    if body.get("messages") is not None:
        # Tier classification reads `messages` first: a completion must not carry them.
        raise bad_request("'messages' is not a field of /v1/completions.", param="messages")


def _check_responses(body: dict[str, Any]) -> None:
    input_ = body.get("input")
    if not isinstance(input_, str | list):
        raise bad_request("'input' must be a string or an array of input items.", param="input")
    _check_optional(body, "instructions", str, "a string")
    _check_optional(body, "previous_response_id", str, "a string")
    _check_optional(body, "tools", list, "an array")
    _check_int(body, "max_output_tokens", 1, 2**31)
    if body.get("messages") is not None:
        raise bad_request("'messages' is not a field of /v1/responses.", param="messages")


def _check_embeddings(body: dict[str, Any]) -> None:
    if isinstance(body.get("messages"), list):
        return  # vLLM's chat-style embedding request
    input_ = body.get("input")
    if not (isinstance(input_, str) or (isinstance(input_, list) and input_)):
        raise bad_request(
            "'input' must be a string, an array of strings or an array of token ids.",
            param="input",
        )


_SCORE_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                ("data_1", "data_2"))  # fmt: skip
"""The spellings of a /v1/score request's two sides that vLLM accepts."""


def _check_score(body: dict[str, Any]) -> None:
    if not any(a in body and b in body for a, b in _SCORE_PAIRS):
        raise bad_request(
            "/v1/score needs 'text_1' and 'text_2' (or 'queries' and 'documents').",
            param="text_1",
        )


def _check_rerank(body: dict[str, Any]) -> None:
    if body.get("query") is None:
        raise bad_request("'query' is required.", param="query")
    if not isinstance(body.get("documents"), list | dict):
        raise bad_request("'documents' must be an array.", param="documents")
    _check_int(body, "top_n", 0, 2**31)


def _check_tokenize(body: dict[str, Any]) -> None:
    if isinstance(body.get("prompt"), str):
        return
    if isinstance(body.get("messages"), list):
        return
    raise bad_request("'prompt' (a string) or 'messages' (an array) is required.", param="prompt")


def _check_detokenize(body: dict[str, Any]) -> None:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad_request("'tokens' must be an array of token ids.", param="tokens")


_CHECKS = {
    Endpoint.CHAT: _check_chat,
    Endpoint.COMPLETIONS: _check_completion,
    Endpoint.RESPONSES: _check_responses,
    Endpoint.EMBEDDINGS: _check_embeddings,
    Endpoint.SCORE: _check_score,
    Endpoint.RERANK: _check_rerank,
    Endpoint.TOKENIZE: _check_tokenize,
    Endpoint.DETOKENIZE: _check_detokenize,
}
"""What each endpoint's body must hold for the gateway to route it; the replica checks the rest."""


def _check_depth(body: dict[str, Any], raw: bytes, max_depth: int) -> None:
    """Rejects nesting deeper than `max_depth` (the body object itself is level 1).

    Counting brackets in the raw text is nearly free, and a body with fewer openers than the
    limit cannot be too deep (a long token-id prompt ends here). Otherwise the parsed body is
    walked, visiting containers only: a long prompt is one string, however many brackets of
    code it holds."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    raise too_deeply_nested(max_depth)
                stack.append((child, depth + 1))


def too_deeply_nested(max_depth: int) -> ApiError:
    return bad_request(
        f"The request body is nested deeper than {max_depth} levels.",
        param="body", code="too_deeply_nested",
    )  # fmt: skip


def _check_optional(body: dict[str, Any], name: str, kind: type, described: str) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad_request(f"'{name}' must be {described}.", param=name)


def _check_int(body: dict[str, Any], name: str, low: int, high: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"'{name}' must be an integer from {low} to {high}.", param=name)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(
                f"'messages[{i}]' must be an object with a string 'role'.", param=f"messages[{i}]"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(
                f"'messages[{i}].content' must be a string or an array of parts.",
                param=f"messages[{i}].content",
            )


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str) and prompt:
        return
    if isinstance(prompt, list) and prompt and _all_strings_or_token_lists(prompt):
        return
    raise bad_request(
        "'prompt' must be a non-empty string, array of strings or array of token ids.",
        param="prompt",
    )


def _all_strings_or_token_lists(items: list[Any]) -> bool:
    if all(isinstance(x, str) for x in items):
        return True
    if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        return True
    return all(isinstance(x, list) and x and all(isinstance(t, int) for t in x) for x in items)
