"""What a tier classifier reads of a request's shape: the same asks on either API, and the task
where the instructions alone set it."""

from __future__ import annotations

from typing import Any

from router_policies.tier_classifier import extract_features, task_texts
from router_policies.tier_classifier_learned import request_features
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings
from router_policies.tiers import Tier
from tests.tiers import HARD


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_a_responses_request_asks_its_budget_and_shape_as_the_same_chat_does() -> None:
    # /v1/responses names them max_output_tokens and text.format.
    structured = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    as_chat = chat("Write a story.", max_tokens=2000, response_format=structured)
    as_responses = {
        "input": "Write a story.",
        "max_output_tokens": 2000,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
    }
    features = extract_features(as_responses)
    assert (features["max_tokens"], features["structured_output"]) == (
        extract_features(as_chat)["max_tokens"],
        1.0,
    )
    texts, turns = task_texts(as_responses)
    learned = request_features(as_responses, texts, turns, sentences=0)
    assert "#structured_output" in learned and any(f.startswith("#max_tokens:") for f in learned)


def test_a_task_given_in_the_instructions_alone_is_scored_on_them() -> None:
    system_only = {"messages": [{"role": "system", "content": HARD}]}
    assert task_texts(system_only) == ((HARD,), 0)
    assert task_texts({"instructions": HARD, "input": []})[0] == (HARD,)
    tiers = TierRouter("auto", TierSettings(small="small", large="large"))
    assert tiers.classify(system_only).tier is Tier.LARGE
