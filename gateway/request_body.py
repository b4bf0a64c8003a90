"""Parsing and checking a request body once, up front, into what routing needs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from gateway.errors import bad_request
from router_policies.fingerprint import CanonicalPrompt, canonical_chat, canonical_prompt


class Endpoint(StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    raw: bytes
    """Forwarded unchanged: the replica sees exactly what the client sent."""
    body: dict[str, Any]
    model: str
    stream: bool

    def canonical_text(self) -> CanonicalPrompt:
        if self.endpoint is Endpoint.CHAT:
            return canonical_chat(self.body["messages"], self.body.get("tools"))
        return canonical_prompt(self.body["prompt"])

    @property
    def cache_salt(self) -> str:
        salt = self.body.get("cache_salt")
        return salt if isinstance(salt, str) else ""


def parse_request(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string.", param="model")
    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    return ParsedRequest(endpoint, raw, body, model, stream)


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
