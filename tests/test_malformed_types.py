"""A body whose `type` (or a scored prompt) is a list or an object where vLLM reads a string is
the replica's to refuse with its own 400: on the way there, the fingerprint, the tier score and
the tier memory read it as nothing they know, never failing on it (a 500 and a logged stack
trace for any client that sends one)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.resolve import resolve
from tests.tiers import fleet

USER = {"role": "user", "content": "Where is the ferry?"}
BODIES: list[tuple[Endpoint, dict[str, Any]]] = [
    (Endpoint.CHAT, {"messages": [USER], "response_format": {"type": ["json_object"]}}),
    (Endpoint.RESPONSES, {"input": "Where is the ferry?", "text": {"format": {"type": {}}}}),
    (
        Endpoint.RESPONSES,
        {"input": [{"role": "user", "content": [{"type": ["input_text"], "text": "hi"}]}]},
    ),
    (Endpoint.SCORE, {"text_1": "a", "text_2": "b", "prompt": 5}),
]


@pytest.mark.parametrize(("endpoint", "body"), BODIES, ids=["format", "text", "part", "prompt"])
def test_a_malformed_type_is_routed_on_for_the_replica_to_refuse(
    endpoint: Endpoint, body: dict[str, Any]
) -> None:
    parsed = parse_request(endpoint, orjson.dumps({"model": "auto", **body}))
    resolution = resolve(fleet(), parsed, None)
    assert resolution.verdict is not None
    assert resolution.pool.name in ("small", "large")
    if endpoint.prefix_routed:
        assert parsed.canonical_text().text
