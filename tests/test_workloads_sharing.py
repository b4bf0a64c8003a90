"""The workloads that vary how much is shared and how requests arrive: multi-round QA (every
user on one system prompt), low sharing (a short shared part before a long unique one, SGLang's
shape swapped), Zipf popularity over groups (one hot group), seeded open-loop Poisson arrivals,
and a prompt with no system part sent as one user message."""

from __future__ import annotations

import inspect
import itertools

import pytest

from bench.workloads import (
    CHARS_PER_TOKEN,
    Conversation,
    generated_shared_prefix,
    low_sharing,
    multi_turn_shared_prefix,
    poisson_arrivals,
    split_schedule,
    total_requests,
    zipf_groups,
    zipf_weights,
)


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
