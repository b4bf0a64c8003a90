"""The multi-turn and generated shared-prefix workloads: reproducible from a seed and sized by
their parameters, the users of a group sharing its system prompt while groups share less than
one KV block, each round's prompt extending the last with the real answers, and the random
text's four characters a token."""

from __future__ import annotations

import random

import pytest

from bench.workloads import (
    CHARS_PER_TOKEN,
    Conversation,
    generated_shared_prefix,
    multi_turn_shared_prefix,
    random_text,
    total_requests,
)
from tests.workloads import common_prefix

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
            assert common_prefix(a, b) < KV_BLOCK_CHARS


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
