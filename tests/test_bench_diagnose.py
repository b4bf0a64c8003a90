"""`llm-gateway bench diagnose`: its settings overrides and its model of the replicas' caches."""

from __future__ import annotations

import pytest

from bench.compare.mooncake import REPORT_WINDOWS, TUNING_WINDOWS
from bench.compare.plan import DEFAULT_SEEDS, TUNING_SEEDS
from bench.diagnose import RunFigures, cache_model, capacity_blocks, compare_seed, overrides, spread
from bench.driver import RequestResult
from bench.workloads_mooncake import TraceRecord


def test_dotted_settings_become_the_nested_pool_mapping() -> None:
    assert overrides(["cost.copy_weight=10", "prefix.min_match_ratio=0.3", "policy=x"]) == {
        "cost": {"copy_weight": 10},
        "prefix": {"min_match_ratio": 0.3},
        "policy": "x",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        overrides(["cost.copy_weight"])


def record(*hash_ids: int) -> TraceRecord:
    return TraceRecord(0, 512 * len(hash_ids), 1, hash_ids)


def sent(conversation: str, replica: str) -> RequestResult:
    return RequestResult(200, 0.1, conversation=conversation, replica=replica)


def test_the_model_tells_chosen_best_and_unbounded_apart() -> None:
    records = {
        "m0": record(0, 1, 2),  # a conversation's first turn, on a
        "m1": record(0, 3),  # another, on b
        "m2": record(0, 1, 2, 4),  # the first's next turn, sent away to b
        "m3": record(0, 3, 5, 6),  # the second's next turn, at home on b
    }
    order = [sent("m0", "a"), sent("m1", "b"), sent("m2", "b"), sent("m3", "b")]
    model = cache_model(records, order, capacity=100)
    total = 512 * (3 + 2 + 4 + 4)
    assert model.chosen == pytest.approx(512 * (1 + 2) / total)  # m2 found block 0 on b
    # The best: a's block 0 for m1, a's 3 blocks for m2, b's 2 for m3.
    assert model.best == pytest.approx(512 * (1 + 3 + 2) / total)
    assert model.unbounded == model.chosen  # caches this large forget nothing
    assert model.sent_away == 1
    assert model.sent_away_share == pytest.approx(512 * 2 / total)


def test_a_small_cache_forgets_the_least_recently_used_blocks() -> None:
    records = {"m0": record(1, 2), "m1": record(3, 4), "m2": record(1, 2, 5)}
    order = [sent("m0", "a"), sent("m1", "a"), sent("m2", "a")]
    model = cache_model(records, order, capacity=2)
    assert model.chosen == 0.0 and model.unbounded == pytest.approx(2 * 512 / (7 * 512))


def test_the_model_holds_what_the_sims_kv_cache_holds() -> None:
    assert capacity_blocks() == 1024  # 6,144 blocks of 16 tokens, 96-token trace blocks


def test_the_spread_over_runs_tells_a_tie_from_a_difference() -> None:
    runs = {
        "gateway": [RunFigures(0.70, 300, 900), RunFigures(0.80, 320, 1000)],
        "close peer": [RunFigures(0.75, 400, 1100), RunFigures(0.78, 420, 1200)],
        "far peer": [RunFigures(0.60, 400, 1100), RunFigures(0.61, 420, 1200)],
    }
    lines = spread(runs).splitlines()
    assert lines[0] == (
        "gateway, 2 runs: hit/bound 0.700-0.800 (mean 0.750); "
        "TTFT p90 300-320 (mean 310) ms, p99 900-1000 (mean 950) ms"
    )
    # Standard errors: sqrt(0.005 / 2) = 0.05 for the gateway, sqrt(0.00045 / 2) = 0.015 and
    # sqrt(0.00005 / 2) = 0.005 for the peers.
    assert lines[3] == (
        "hit/bound, gateway - close peer: -0.015 in the means, twice its standard error 0.104; "
        "within it: a tie at this many runs"
    )
    assert lines[4] == (
        "hit/bound, gateway - far peer: +0.145 in the means, twice its standard error 0.100; "
        "beyond it"
    )


def test_a_window_is_diagnosed_on_the_block_texts_bench_compare_replays_it_with() -> None:
    # The report windows on the first report seed, as the committed compare run; the others on
    # a tuning seed.
    assert {compare_seed(w) for w in REPORT_WINDOWS} == {DEFAULT_SEEDS[0]}
    assert {compare_seed(w) for w in TUNING_WINDOWS} == {TUNING_SEEDS[0]}
