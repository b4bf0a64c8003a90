"""The benchmark workloads: reproducible from a seed, shared prefixes exactly where intended."""

from __future__ import annotations

import inspect
import itertools
import random

import pytest

from bench.workloads import (
    CHARS_PER_TOKEN,
    Conversation,
    generated_shared_prefix,
    low_sharing,
    multi_turn_shared_prefix,
    poisson_arrivals,
    random_text,
    total_requests,
    zipf_groups,
    zipf_weights,
)

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
