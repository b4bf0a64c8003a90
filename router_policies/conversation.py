"""A request's conversation as chat messages, whichever API carries it.

Chat completions carry ``messages``; /v1/responses carries ``instructions`` and ``input``
items. Everything that reads a conversation (its fingerprint, its tier score, its tier memory)
reads this one view, so the same conversation is routed alike on either API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_RESPONSES_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))


def responses_messages(instructions: Any, input_: Any) -> list[Mapping[str, Any]]:
    """/v1/responses: `instructions` lead as a system message would, then the input items in
    order, each as the chat message it stands for (input_text/output_text parts as text parts).
    Items that are not messages (function calls and their outputs, reasoning) are turns of
    their own, under their type as the role."""
    messages: list[Mapping[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
    elif isinstance(input_, list):
        for item in input_:
            if not isinstance(item, Mapping):
                messages.append({"role": "item", "content": item})
            elif isinstance(item.get("role"), str) and item.get("type", "message") == "message":
                content = item.get("content")
                if isinstance(content, list):
                    content = [
                        {"type": "text", "text": p.get("text", "")}
                        if isinstance(p, Mapping) and _is_in(p.get("type"), _RESPONSES_TEXT_PARTS)
                        else p
                        for p in content
                    ]
                messages.append({"role": item["role"], "content": content})
            else:
                messages.append({"role": str(item.get("type", "item")), "content": item})
    return messages


_last_view: tuple[Any, Any, list[Mapping[str, Any]]] | None = None
"""The last /v1/responses view built, with the `instructions` and `input` it was built from. A
request's body is read by its fingerprint, its tier score and its tier memory, up to four
times, and a view of 20 items costs tens of microseconds to build. Keyed by the identity of
those two values (a parsed body is not changed, and the copy a tier makes to name its pool's
model shares them): one view per request, none kept beyond the last."""


def responses_view(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A /v1/responses body's `instructions` and `input` as chat messages
    (``responses_messages``), built once per request. Read it, do not change it: it is shared."""
    global _last_view
    instructions, input_ = body.get("instructions"), body.get("input")
    last = _last_view
    if last is not None and last[0] is instructions and last[1] is input_:
        return last[2]
    view = responses_messages(instructions, input_)
    _last_view = (instructions, input_, view)
    return view


def chat_messages(body: Mapping[str, Any]) -> Sequence[Any] | None:
    """The body's conversation as chat messages: chat's own, or a /v1/responses body's input
    read as chat; None for a body that carries neither (a completion's prompt)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return messages
    if "input" in body:
        return responses_view(body)
    return None


_STRUCTURED = frozenset(("json_schema", "json_object"))


def answer_budget(body: Mapping[str, Any]) -> int | None:
    """The most tokens the request lets the answer have, on either API (chat's
    ``max_completion_tokens`` or ``max_tokens``, /v1/responses' ``max_output_tokens``); None
    where it sets none that is a positive integer."""
    budget = (
        body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
    )
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return budget
    return None


def asks_structured_output(body: Mapping[str, Any]) -> bool:
    """Whether the answer must follow a JSON schema or be JSON: chat's ``response_format``, or
    /v1/responses' ``text.format``."""
    shape = body.get("response_format")
    if shape is None and isinstance(text := body.get("text"), Mapping):
        shape = text.get("format")
    return isinstance(shape, Mapping) and _is_in(shape.get("type"), _STRUCTURED)


def _is_in(kind: Any, names: frozenset[str]) -> bool:
    """Whether a body's ``type`` is one of ``names``: a list or an object there is the client's
    mistake for the replica to answer (400), not one to fail on (unhashable)."""
    return isinstance(kind, str) and kind in names
