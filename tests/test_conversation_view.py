"""A /v1/responses body is read as the chat it stands for once, whatever reads it: its
fingerprint, its tier score and its tier memory share one view (a view of a long input costs
tens of microseconds to build), and a view is never another body's."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import orjson
import pytest

from gateway.http.request_body import Endpoint, parse_request
from router_policies import conversation
from router_policies.tier_classifier_learned import LearnedTierModel
from tests.tiers import conversation_key, follow_up

BODY: dict[str, Any] = {
    "model": "auto",
    "instructions": "You answer questions about the harbour.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Where is the ferry?"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "At pier two."}],
        },
        {"role": "user", "content": "And when does it leave?"},
    ],
}


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a view was built."""
    calls: list[int] = []
    build = conversation.responses_messages

    def counted(instructions: Any, input_: Any) -> list[Any]:
        calls.append(1)
        return build(instructions, input_)

    monkeypatch.setattr(conversation, "responses_messages", counted)
    return calls


def test_everything_that_reads_a_request_reads_one_view(built: list[int]) -> None:
    parsed = parse_request(Endpoint.RESPONSES, orjson.dumps(BODY))
    assert conversation_key(parsed.body) is not None
    assert follow_up(parsed.body)
    LearnedTierModel.load().score(parsed.body)
    # A tier names its pool's model in a copy of the body, which the fingerprint reads.
    named = dataclasses.replace(parsed, body={**parsed.body, "model": "llama-3.1-70b"})
    named.canonical_text()
    assert len(built) == 1


def test_a_view_is_never_another_bodys(built: list[int]) -> None:
    equal, other = copy.deepcopy(BODY), copy.deepcopy(BODY)
    other["input"][-1]["content"] = "And where does it go?"
    views = [conversation.chat_messages(b) for b in (BODY, equal, other, BODY)]
    assert views[0] == views[1] == views[3] != views[2]
    assert len(built) == 4  # one view is kept, the last one's: each of these is built anew
