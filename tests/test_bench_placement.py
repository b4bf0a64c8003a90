"""`llm-gateway bench placement`: its tail-first cache model and the trace's turn statistics."""

from __future__ import annotations

from collections import OrderedDict
from typing import cast

import pytest

from bench.placement import Prompt, cache_aware_replay, next_turn_chances
from bench.workloads_mooncake import (
    TraceRecord,
    lru_remember,
    lru_reuse,
    optimal_reuse,
    summarise,
)
from router_policies.fingerprint import RequestFeatures


def record(*hash_ids: int) -> TraceRecord:
    return TraceRecord(0, 512 * len(hash_ids), 1, hash_ids)


def test_the_model_evicts_a_prompts_tail_before_its_head() -> None:
    cache: OrderedDict[int, None] = OrderedDict()
    for prompt in (record(0, 1, 2), record(0, 3), record(4)):
        lru_remember(cache, prompt, 4, tail_first=True)
    # 2, the first prompt's tail, went; its head 0-1 is still a usable prefix.
    assert list(cache) == [1, 3, 0, 4]


def test_one_fleet_sized_lru_serves_what_it_still_holds() -> None:
    turns = [record(0, 1), record(2, 3), record(0, 1, 5)]
    assert summarise(turns).token_reuse == pytest.approx(2 / 7)
    assert lru_reuse(turns, 4, tail_first=True) == pytest.approx(2 / 7)
    # Two blocks of room: the second prompt evicts the first, whose next turn starts cold.
    assert lru_reuse(turns, 2, tail_first=True) == 0.0


def test_the_cache_that_knows_the_future_evicts_what_nothing_uses_again() -> None:
    # Conversation 1-2 continues after a one-off prompt 3-4; two blocks of room. An LRU
    # evicts the history for the one-off; the optimal cache evicts the one-off instead.
    turns = [record(1, 2), record(3, 4), record(1, 2, 5)]
    assert lru_reuse(turns, 2, tail_first=True) == 0.0
    assert optimal_reuse(turns, 2) == pytest.approx(2 / 7)
    # With no room it serves nothing; with room for everything it serves the whole bound.
    assert optimal_reuse(turns, 0) == 0.0
    assert optimal_reuse(turns, 64) == pytest.approx(summarise(turns).token_reuse)


def test_a_turn_counts_as_continued_when_a_later_prompt_holds_its_last_full_block() -> None:
    trace = [
        record(0, 10, 11),  # conversation 10, turn 1: continued below
        record(0, 20, 21),  # conversation 20, turn 1: never continued
        record(0, 10, 11, 12),  # conversation 10, turn 2: not continued
    ]
    assert next_turn_chances(trace) == [(1, 2, 0.5), (2, 1, 0.0)]


def test_the_peers_rule_follows_a_match_above_its_threshold_else_the_smallest_tree() -> None:
    def prompts(*records: TraceRecord) -> list[Prompt]:
        return [Prompt(r, cast(RequestFeatures, None), float(i)) for i, r in enumerate(records)]

    # Three new conversations fill three replicas' trees one each (smallest tree first); the
    # first's next turn matches 2 of its 3 blocks (above 0.3) and goes home: served.
    continued = prompts(record(1, 2), record(3, 4), record(5, 6), record(1, 2, 7))
    assert cache_aware_replay(continued, 64) == pytest.approx(2 / 9)
    # A prompt matching 1 block of 4 (0.25, below 0.3) goes to the smallest tree instead: cold.
    weak = prompts(record(1, 2), record(3, 4), record(1, 8, 9, 10))
    assert cache_aware_replay(weak, 64) == 0.0
