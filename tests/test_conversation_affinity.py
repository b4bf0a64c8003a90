"""A conversation's next turn goes back to the replica that holds its history, whatever the
prompt's shape: chat with or without a system prompt, one long user message, a tool loop,
/v1/completions prompts and /v1/responses input items. No shared lead is needed: the history
is a prefix of the next prompt, and the cost model weighs what each replica holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router_policies.decision import Route
from router_policies.fingerprint import (
    CanonicalPrompt,
    canonical_chat,
    canonical_prompt,
    canonical_responses,
)
from router_policies.policies.prefix_aware import PrefixAware
from tests.routing import POOL, candidate, choose, features, snapshot

QUESTION = "Summarise the attached report section by section. " * 160  # ~8 KB
ANSWER = "Section one says the fleet grew. " * 8
FOLLOW_UP = "Now the same for the appendix."


def chat(system: bool) -> tuple[CanonicalPrompt, CanonicalPrompt]:
    lead = [{"role": "system", "content": "Be brief."}] if system else []
    first = [*lead, {"role": "user", "content": QUESTION}]
    turn = [*first, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": FOLLOW_UP}]  # fmt: skip
    return canonical_chat(first), canonical_chat(turn)


def tool_loop() -> tuple[CanonicalPrompt, CanonicalPrompt]:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    first: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}  # fmt: skip
    turn = [*first, call, {"role": "tool", "tool_call_id": "c1", "content": ANSWER}]
    return canonical_chat(first, tools), canonical_chat(turn, tools)


def completions() -> tuple[CanonicalPrompt, CanonicalPrompt]:
    return canonical_prompt(QUESTION), canonical_prompt(QUESTION + ANSWER + FOLLOW_UP)


def responses() -> tuple[CanonicalPrompt, CanonicalPrompt]:
    first: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ANSWER}]}  # fmt: skip
    turn = [*first, answer, {"role": "user", "content": FOLLOW_UP}]
    return canonical_responses({"input": first}), canonical_responses({"input": turn})


SHAPES: dict[str, Callable[[], tuple[CanonicalPrompt, CanonicalPrompt]]] = {
    "chat without a system prompt": lambda: chat(system=False),
    "chat with a short system prompt": lambda: chat(system=True),
    "a tool loop": tool_loop,
    "/v1/completions": completions,
    "/v1/responses": responses,
}


@pytest.mark.parametrize("shape", SHAPES)
def test_the_next_turn_waits_for_the_replica_holding_its_history(shape: str) -> None:
    """ "a" holds the first turn (~8 KB, ~2k tokens) and has ~6.6k tokens of prefill queued
    (~0.7 s): an idle replica would answer in ~0.25 s, cold, but copy the history there. The
    copy costs more than the wait, so the turn stays with its history."""
    first, turn = (features(p) for p in SHAPES[shape]())
    assert first.lead_bytes < 0.5 * turn.hashed_bytes  # no lead worth a home: history alone
    policy = PrefixAware(POOL)
    opening = choose(policy, snapshot(), first)
    policy.record(first, type(opening)("a", opening.route), now=0.0)
    queued = candidate("a", pending_prefill_tokens=6600, pending_requests=1, running=1)
    decision = choose(policy, snapshot(queued), turn)
    assert (decision.replica, decision.route) == ("a", Route.PREFIX_HIT)
    assert decision.uncached_tokens < 0.2 * turn.hashed_bytes / POOL.prefix.chars_per_token
