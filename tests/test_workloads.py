"""The benchmark workloads: reproducible from a seed, shared prefixes exactly where intended."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.workloads import (
    CHARS_PER_TOKEN,
    Conversation,
    RequestSpec,
    generated_shared_prefix,
    low_sharing,
    multi_turn_shared_prefix,
    poisson_arrivals,
    random_text,
    split_schedule,
    total_requests,
    zipf_groups,
    zipf_weights,
)
from bench.workloads_agents import (
    AgentConversation,
    content_chars,
    long_context_agents,
    tools_json_chars,
)
from bench.workloads_mooncake import mooncake_schedule, read_trace, summarise
from bench.workloads_overload import OVERLOAD_PHASES, Phase, overload, phase_arrivals, phase_of
from replica.sim.tokenizer import render_chat

KV_BLOCK_CHARS = 16 * CHARS_PER_TOKEN
"""One KV block of the sim's (and vLLM's) default 16 tokens, in characters."""


def _multi_turn(seed: int = 7, users_per_group: int = 3) -> list[Conversation]:
    return multi_turn_shared_prefix(
        groups=4,
        users_per_group=users_per_group,
        rounds=3,
        system_tokens=256,
        question_tokens=32,
        answer_tokens=16,
        seed=seed,
    )


def _common_prefix(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_the_same_seed_gives_the_same_workload() -> None:
    assert _multi_turn(seed=7) == _multi_turn(seed=7)
    assert generated_shared_prefix(3, 2, 64, 16, 8, seed=1) == generated_shared_prefix(
        3, 2, 64, 16, 8, seed=1
    )


def test_another_seed_gives_other_text() -> None:
    first, second = _multi_turn(seed=7), _multi_turn(seed=8)
    assert {c.system for c in first}.isdisjoint({c.system for c in second})
    assert {c.questions for c in first}.isdisjoint({c.questions for c in second})


def test_sizes_follow_the_parameters() -> None:
    workload = _multi_turn()
    assert len(workload) == 4 * 3
    assert total_requests(workload) == 4 * 3 * 3
    for conversation in workload:
        assert len(conversation.system) == 256 * CHARS_PER_TOKEN
        assert conversation.rounds == 3
        assert all(len(q) == 32 * CHARS_PER_TOKEN for q in conversation.questions)
        assert conversation.max_tokens == 16


def test_users_of_a_group_share_its_system_prompt() -> None:
    by_group: dict[int, set[str]] = {}
    for conversation in _multi_turn():
        by_group.setdefault(conversation.group, set()).add(conversation.system)
    assert sorted(by_group) == [0, 1, 2, 3]
    assert all(len(prompts) == 1 for prompts in by_group.values())


def test_groups_share_less_than_one_kv_block() -> None:
    prompts = sorted({c.system for c in _multi_turn()})
    assert len(prompts) == 4
    for i, a in enumerate(prompts):
        for b in prompts[i + 1 :]:
            assert _common_prefix(a, b) < KV_BLOCK_CHARS


def test_users_ask_their_own_questions() -> None:
    questions = [q for c in _multi_turn() for q in c.questions]
    assert len(set(questions)) == len(questions)


def test_a_group_keeps_its_text_when_users_are_added() -> None:
    """Text is seeded per group and user, so a larger run extends a smaller one."""
    small = {c.id: c for c in _multi_turn(users_per_group=2)}
    large = {c.id: c for c in _multi_turn(users_per_group=5)}
    assert all(large[key] == conversation for key, conversation in small.items())


def test_arrivals_mix_the_groups() -> None:
    groups = [c.group for c in _multi_turn()]
    assert groups != sorted(groups)


def test_round_zero_is_the_system_prompt_and_the_first_question() -> None:
    conversation = _multi_turn()[0]
    spec = conversation.request(0, [])
    assert spec.messages == (
        {"role": "system", "content": conversation.system},
        {"role": "user", "content": conversation.questions[0]},
    )
    assert (spec.conversation, spec.group, spec.round) == (
        conversation.id,
        conversation.group,
        0,
    )
    assert spec.max_tokens == conversation.max_tokens


def test_history_grows_with_earlier_questions_and_the_real_answers() -> None:
    conversation = _multi_turn()[0]
    answers = ["first answer ", "second answer "]
    previous = conversation.request(0, [])
    for round_ in (1, 2):
        spec = conversation.request(round_, answers[:round_])
        # The previous round's prompt is a prefix of this one: what a prefix cache can reuse.
        assert spec.messages[: len(previous.messages)] == previous.messages
        assert spec.messages[len(previous.messages) :] == (
            {"role": "assistant", "content": answers[round_ - 1]},
            {"role": "user", "content": conversation.questions[round_]},
        )
        previous = spec
    # The system prompt, two answered rounds, and the third question.
    assert len(previous.messages) == 1 + 2 * 2 + 1


def test_a_round_needs_exactly_the_earlier_answers() -> None:
    conversation = _multi_turn()[0]
    with pytest.raises(ValueError, match="earlier answers"):
        conversation.request(2, ["only one"])
    with pytest.raises(IndexError):
        conversation.request(3, ["a", "b", "c"])


def test_generated_shared_prefix_is_single_turn_with_a_prompt_per_group() -> None:
    workload = generated_shared_prefix(
        groups=3, prompts_per_group=4, system_tokens=128, question_tokens=16, output_tokens=8
    )
    assert len(workload) == 12
    assert all(c.rounds == 1 and c.max_tokens == 8 for c in workload)
    assert all(len(c.system) == 128 * CHARS_PER_TOKEN for c in workload)
    assert all(len(c.questions[0]) == 16 * CHARS_PER_TOKEN for c in workload)
    assert len({c.system for c in workload}) == 3
    assert len({c.questions[0] for c in workload}) == 12


def test_generated_shared_prefix_defaults_are_sglangs() -> None:
    workload = generated_shared_prefix()
    assert len(workload) == 64 * 16
    sample = workload[0]
    assert len(sample.system) == 2048 * CHARS_PER_TOKEN
    assert len(sample.questions[0]) == 128 * CHARS_PER_TOKEN
    assert sample.max_tokens == 256


@pytest.mark.parametrize("tokens", [1, 7, 100])
def test_random_text_has_four_characters_per_token(tokens: int) -> None:
    text = random_text(random.Random(0), tokens, lead="Hello.")
    assert len(text) == tokens * CHARS_PER_TOKEN
    assert text.startswith("Hello."[: tokens * CHARS_PER_TOKEN])
    assert " " in random_text(random.Random(0), 100)


# --- multi-round QA, low sharing, Zipf popularity, Poisson arrivals ---------------------------


def test_multi_round_qa_is_one_group_sharing_one_system_prompt() -> None:
    """vLLM production stack's multi-round QA: every user shares ONE system prompt."""
    workload = multi_turn_shared_prefix(1, 6, 3, 1000, 32, 25, seed=3)
    assert {c.group for c in workload} == {0}
    assert len({c.system for c in workload}) == 1
    assert len(workload[0].system) == 1000 * CHARS_PER_TOKEN
    assert total_requests(workload) == 6 * 3


def test_low_sharing_has_a_short_shared_part_and_a_long_unique_one() -> None:
    workload = low_sharing(
        groups=4, prompts_per_group=3, shared_tokens=32, unique_tokens=256, output_tokens=8
    )
    assert workload == low_sharing(4, 3, 32, 256, 8)
    assert len(workload) == 12
    assert all(len(c.system) == 32 * CHARS_PER_TOKEN for c in workload)
    assert all(len(c.questions[0]) == 256 * CHARS_PER_TOKEN for c in workload)
    assert len({c.system for c in workload}) == 4
    assert len({c.questions[0] for c in workload}) == 12


def test_low_sharing_defaults_mirror_generated_shared_prefix() -> None:
    """SGLang's shape with the shared (2,048) and unique (128) lengths swapped."""
    low = inspect.signature(low_sharing).parameters
    gsp = inspect.signature(generated_shared_prefix).parameters
    assert low["groups"].default == gsp["groups"].default == 64
    assert low["prompts_per_group"].default == gsp["prompts_per_group"].default == 16
    assert low["shared_tokens"].default == gsp["question_tokens"].default == 128
    assert low["unique_tokens"].default == gsp["system_tokens"].default == 2048
    assert low["output_tokens"].default == gsp["output_tokens"].default == 256


def test_zipf_weights_fall_with_rank_and_sum_to_one() -> None:
    weights = zipf_weights(8, 1.0)
    assert sum(weights) == pytest.approx(1.0)
    assert all(a > b for a, b in itertools.pairwise(weights))
    assert weights[0] / weights[3] == pytest.approx(4.0)
    assert zipf_weights(3, 0.0) == pytest.approx([1 / 3] * 3)
    with pytest.raises(ValueError):
        zipf_weights(0, 1.0)


def test_zipf_groups_is_seeded_and_has_one_hot_group() -> None:
    workload = zipf_groups(groups=16, requests=2000, exponent=1.0, system_tokens=64,
                           question_tokens=16, output_tokens=4, seed=5)  # fmt: skip
    assert workload == zipf_groups(16, 2000, 1.0, 64, 16, 4, seed=5)
    assert workload != zipf_groups(16, 2000, 1.0, 64, 16, 4, seed=6)
    assert len(workload) == 2000 and all(c.rounds == 1 for c in workload)
    counts = [sum(1 for c in workload if c.group == g) for g in range(16)]
    # Group 0 is the hot one, close to its Zipf share (1 / H_16 = 29.6%).
    assert counts[0] == max(counts)
    assert counts[0] / 2000 == pytest.approx(zipf_weights(16, 1.0)[0], abs=0.03)
    assert counts[0] > 3 * counts[3]
    # One system prompt per group, every question its own.
    assert all(len({c.system for c in workload if c.group == g}) <= 1 for g in range(16))
    assert len({c.questions[0] for c in workload}) == 2000
    assert len({c.id for c in workload}) == 2000
    # A group's system prompt is generated-shared-prefix's for the same seed and group.
    gsp = {c.group: c.system for c in generated_shared_prefix(16, 1, 64, 16, 4, seed=5)}
    assert all(c.system == gsp[c.group] for c in workload)


def test_zipf_groups_arrive_mixed() -> None:
    groups = [c.group for c in zipf_groups(8, 200, 1.0, 32, 8, 4)]
    assert groups != sorted(groups)


def test_poisson_arrivals_are_seeded_and_open_loop() -> None:
    arrivals = poisson_arrivals(5000, rate=20.0, seed=1)
    assert arrivals == poisson_arrivals(5000, 20.0, seed=1)
    assert arrivals != poisson_arrivals(5000, 20.0, seed=2)
    assert arrivals[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(arrivals))
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 20.0, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert spread == pytest.approx(mean, rel=0.1)


def test_poisson_arrivals_edge_cases() -> None:
    assert poisson_arrivals(0, 1.0) == []
    assert poisson_arrivals(1, 1.0) == [0.0]
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0)
    with pytest.raises(ValueError):
        poisson_arrivals(-1, 1.0)


def test_an_empty_system_prompt_sends_no_system_message() -> None:
    spec = Conversation("t", 0, "", ("the whole prompt",), 4).request(0, [])
    assert spec.messages == ({"role": "user", "content": "the whole prompt"},)
    assert split_schedule([(0.5, Conversation("t", 0, "", ("q",), 4))]) == (
        [0.5],
        [Conversation("t", 0, "", ("q",), 4)],
    )


# --- long-context agents ----------------------------------------------------------------------


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
    shared = _common_prefix(first, second)
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


# --- overload -------------------------------------------------------------------------------


def test_overload_follows_its_phases() -> None:
    arrivals = phase_arrivals(50.0, OVERLOAD_PHASES, seed=2)
    assert arrivals == phase_arrivals(50.0, OVERLOAD_PHASES, seed=2)
    assert arrivals != phase_arrivals(50.0, OVERLOAD_PHASES, seed=3)
    assert all(b > a for a, b in itertools.pairwise(arrivals))
    assert 0 < arrivals[0] and arrivals[-1] < 120
    burst = sum(1 for at in arrivals if at < 60)
    recovery = len(arrivals) - burst
    # 60 s at 1.3 x 50/s and 60 s at 0.6 x 50/s (Poisson: within 5 standard deviations).
    assert burst == pytest.approx(3900, abs=5 * 3900**0.5)
    assert recovery == pytest.approx(1800, abs=5 * 1800**0.5)


def test_overload_scales_down_in_time() -> None:
    phases = (Phase(10.0, 1.3), Phase(0.0, 5.0), Phase(10.0, 0.0), Phase(10.0, 0.6))
    arrivals = phase_arrivals(20.0, phases, seed=1, time_scale=0.5)
    assert arrivals[-1] < 15.0
    # The idle phase (load 0, 5 s once scaled) gets no arrivals.
    assert not [at for at in arrivals if 5.0 <= at < 10.0]
    assert [phase_of(at, phases, 0.5) for at in (0.1, 7.0, 14.0, 99.0)] == [0, 2, 3, 3]
    with pytest.raises(ValueError):
        phase_arrivals(0.0, phases)


def test_overload_requests_are_shared_prefix_requests() -> None:
    schedule = overload(
        8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4, groups=4, system_tokens=64,
        question_tokens=8, output_tokens=3,
    )  # fmt: skip
    assert schedule == overload(
        8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4, groups=4, system_tokens=64,
        question_tokens=8, output_tokens=3,
    )  # fmt: skip
    arrivals, conversations = split_schedule(schedule)
    assert arrivals == phase_arrivals(8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4)
    assert all(c.rounds == 1 and c.max_tokens == 3 for c in conversations)
    assert all(len(c.system) == 64 * CHARS_PER_TOKEN for c in conversations)
    assert len({c.group for c in conversations}) == 4
    assert all(len({c.system for c in conversations if c.group == g}) == 1 for g in range(4))
    assert len({c.questions[0] for c in conversations}) == len(conversations)


# --- Mooncake trace replay ----------------------------------------------------------------------

TINY_TRACE: list[dict[str, Any]] = [
    {"timestamp": 0, "input_length": 1200, "output_length": 40, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 1900, "output_length": 3, "hash_ids": [0, 1, 3, 4]},
    {"timestamp": 2500, "input_length": 100, "output_length": 9, "hash_ids": [5]},
    {"timestamp": 4000, "input_length": 600, "output_length": 12, "hash_ids": [0, 6]},
]


def _trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in TINY_TRACE) + "\n\n")
    return path


def test_trace_prompts_follow_input_length_and_share_blocks_by_id(tmp_path: Path) -> None:
    schedule = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125)
    prompts = [c.questions[0] for _, c in schedule]
    block = 512 // 8 * CHARS_PER_TOKEN  # 64 tokens x 4 characters
    assert [len(p) for p in prompts] == [r["input_length"] // 2 for r in TINY_TRACE]
    # Shared hash ids, byte-identical text; a different id, different text.
    assert prompts[0][: 2 * block] == prompts[1][: 2 * block] == schedule[0][1].questions[0][: 2 * block]  # fmt: skip
    assert prompts[0][2 * block : 2 * block + 20] != prompts[1][2 * block : 2 * block + 20]
    assert prompts[3][:block] == prompts[0][:block]
    assert prompts[3][block:] != prompts[0][block : len(prompts[3])]
    assert prompts[2] != prompts[0][: len(prompts[2])]
    # One user message, no system prompt; max_tokens scales with the lengths, at least 1.
    assert schedule[0][1].request(0, []).messages == ({"role": "user", "content": prompts[0]},)
    assert [c.max_tokens for _, c in schedule] == [5, 1, 1, 2]
    assert [c.group for _, c in schedule] == [0, 0, 5, 0]


def test_trace_window_and_rate_scale(tmp_path: Path) -> None:
    schedule = mooncake_schedule(
        _trace_file(tmp_path), start_s=1.0, end_s=4.0, rate_scale=2.0, length_scale=0.125
    )
    assert [(at, c.id) for at, c in schedule] == [(0.25, "m000001"), (0.75, "m000002")]
    capped = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125, max_requests=2)
    assert len(capped) == 2
    # Same ids, same text, whatever the window.
    whole = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125)
    assert schedule[0][1].questions == whole[1][1].questions


def test_trace_summary_is_the_traces_own_bound(tmp_path: Path) -> None:
    summary = summarise(read_trace(_trace_file(tmp_path)))
    assert (summary.requests, summary.span_s) == (4, 4.0)
    assert summary.mean_input_tokens == pytest.approx(3800 / 4)
    # Reused leading blocks: 0 + 2 (ids 0, 1) + 0 + 1 (id 0), over 3 + 4 + 1 + 2 blocks.
    assert summary.block_reuse == pytest.approx(3 / 10)


def test_a_bad_trace_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{"x": 1}\n')  # fmt: skip
    with pytest.raises(ValueError, match=":2:"):
        list(read_trace(path))
