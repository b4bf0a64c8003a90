"""The long-context agents workload: its shape (eight agents of four conversations, a 40 KB
lead of system prompt and tool schemas shared by an agent's conversations only, each
conversation growing to 200 KB over 10-20 rounds), seeded, an agent's conversations parting
right after the lead, and each round extending the last by a tool call and its result."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from bench.workloads import RequestSpec
from bench.workloads_agents import (
    AgentConversation,
    content_chars,
    long_context_agents,
    tools_json_chars,
)
from replica.sim.tokenizer import render_chat
from tests.workloads import common_prefix


@functools.cache
def _agents(seed: int = 3) -> tuple[AgentConversation, ...]:
    return tuple(long_context_agents(seed=seed))


def _lead_chars(conversation: AgentConversation) -> int:
    return len(conversation.system) + tools_json_chars(conversation.tools)


def _last_round(conversation: AgentConversation, answer: str = "") -> RequestSpec:
    return conversation.request(conversation.rounds - 1, [answer] * (conversation.rounds - 1))


def test_agents_have_the_issues_shape() -> None:
    workload = _agents()
    assert len(workload) == 32
    assert sorted(Counter(c.group for c in workload).values()) == [4] * 8
    assert all(10 <= c.rounds <= 20 for c in workload)
    assert len({c.rounds for c in workload}) > 3
    # Each lead (system prompt + tool schemas as the sim renders them) is exactly 40 KB,
    # shared by the agent's conversations and by no other agent.
    assert {_lead_chars(c) for c in workload} == {40_000}
    leads = {c.group: (c.system, c.tools) for c in workload}
    assert all((c.system, c.tools) == leads[c.group] for c in workload)
    assert len({system for system, _ in leads.values()}) == 8
    # Every conversation grows to exactly 200 KB of content (the model's answers aside).
    assert {content_chars(_last_round(c)) for c in workload} == {200_000}
    assert [c.group for c in workload] != sorted(c.group for c in workload)


def test_agents_are_seeded() -> None:
    assert _agents(3) == tuple(long_context_agents(seed=3))
    assert {c.system for c in _agents(3)}.isdisjoint({c.system for c in _agents(4)})


def test_an_agents_conversations_part_right_after_the_shared_lead() -> None:
    one, other = [c for c in _agents() if c.group == 0][:2]
    first = render_chat(one.request(0, []).messages, one.tools)
    second = render_chat(other.request(0, []).messages, other.tools)
    shared = common_prefix(first, second)
    # Past 32 KB (where a capped fingerprint stops) and within the first words of the task.
    assert 40_000 < shared < 40_000 + 100


def test_agent_rounds_grow_by_tool_calls_and_results() -> None:
    conversation = _agents()[0]
    names = {tool["function"]["name"] for tool in conversation.tools}
    answers = [f"answer {k} " for k in range(conversation.rounds)]
    previous = render_chat(conversation.request(0, []).messages, conversation.tools, add_generation_prompt=False)  # fmt: skip
    for round_ in range(1, conversation.rounds):
        spec = conversation.request(round_, answers[:round_])
        assert spec.tools == conversation.tools
        call, result = spec.messages[-2:]
        assert call["role"] == "assistant" and call["content"] == answers[round_ - 1]
        assert call["tool_calls"][0]["function"]["name"] in names
        assert result == {
            "role": "tool",
            "tool_call_id": call["tool_calls"][0]["id"],
            "content": conversation.steps[round_ - 1].result,
        }
        # The earlier round's prompt is a prefix of this one: its KV blocks stay reusable.
        text = render_chat(spec.messages, spec.tools, add_generation_prompt=False)
        assert text.startswith(previous)
        previous = text
    assert len({tuple(c.steps) == tuple(conversation.steps) for c in _agents()}) == 2


def test_agent_sizes_are_parameters() -> None:
    small = long_context_agents(
        agents=2, conversations=3, lead_chars=4_000, final_chars=9_000, min_turns=2,
        max_turns=4, task_chars=100, call_chars=20, answer_tokens=5, seed=1,
    )  # fmt: skip
    assert sorted(c.group for c in small) == [0, 0, 1]
    assert {_lead_chars(c) for c in small} == {4_000}
    assert {content_chars(_last_round(c)) for c in small} == {9_000}
    assert all(2 <= c.rounds <= 4 and c.max_tokens == 5 for c in small)
    with pytest.raises(ValueError):
        long_context_agents(min_turns=5, max_turns=4)
