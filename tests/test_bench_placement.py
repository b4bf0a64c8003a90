"""`llm-gateway bench placement`: its tail-first cache model and the trace's turn statistics."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from bench.placement import next_turn_chances
from bench.workloads_mooncake import TraceRecord, lru_remember, lru_reuse, summarise


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


def test_a_turn_counts_as_continued_when_a_later_prompt_holds_its_last_full_block() -> None:
    trace = [
        record(0, 10, 11),  # conversation 10, turn 1: continued below
        record(0, 20, 21),  # conversation 20, turn 1: never continued
        record(0, 10, 11, 12),  # conversation 10, turn 2: not continued
    ]
    assert next_turn_chances(trace) == [(1, 2, 0.5), (2, 1, 0.0)]
