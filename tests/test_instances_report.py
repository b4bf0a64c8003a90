"""``bench instances``' table: every layout set against one instance, seed by seed."""

from __future__ import annotations

import pytest

from bench.affinity import AffinityBound
from bench.compare.plan import SimScale, sim_workloads
from bench.compare.results import PREFIX_AWARE, Measurement
from bench.instances.cli import SEEDED
from bench.instances.report import combine, markdown
from bench.instances.runner import Layout, Row


def _row(layout: Layout, per_replica: tuple[float, ...], seed: int, hits: float = 80) -> Row:
    measurement = Measurement(
        target=PREFIX_AWARE, workload="gsp", planned=20, sent=20, errors=0, wall_s=1.0,
        ttfts=(0.02,), latencies=(0.3,), itls=(0.01,), output_tokens=100,
        cache_queries=100, cache_hits=hits, requests_per_replica=per_replica,
        bound=AffinityBound(100, 90), seed=seed,
    )  # fmt: skip
    return Row(layout, "gsp", measurement, None)


ONE = Layout(1, False)


def test_multi_round_qa_runs_on_every_seed_here_the_low_sharing_control_on_the_first() -> None:
    workloads = sim_workloads(SimScale.quick(), seeds=(0, 1), seeded=SEEDED)
    assert [(w.info.key, w.seed) for w in workloads] == [
        ("gsp", 0), ("mrqa", 0), ("low", 0), ("zipf", 0), ("gsp", 1), ("mrqa", 1), ("zipf", 1),
    ]  # fmt: skip
    mrqa = [w for w in workloads if w.info.key == "mrqa"]
    assert mrqa[0].info.seeds == (0, 1)
    assert mrqa[0].conversations[0].questions != mrqa[1].conversations[0].questions


def test_balance_is_each_seeds_max_over_mean_averaged_not_the_sum_over_seeds() -> None:
    # Each seed piles work on a different replica: summed, the two look perfectly even.
    rows = [_row(ONE, (30, 10), seed=0), _row(ONE, (10, 30), seed=1)]
    assert combine(rows).balance == pytest.approx(1.5)


def test_hit_rate_is_hits_over_queries_of_every_seed() -> None:
    rows = [_row(ONE, (10, 10), seed=0, hits=80), _row(ONE, (10, 10), seed=1, hits=60)]
    assert combine(rows).hit_rate == pytest.approx(0.7)


def test_each_layout_is_set_against_one_instance_of_the_same_workload() -> None:
    workers = Layout(1, True, workers=2)
    rows = [_row(ONE, (10, 10), seed=0, hits=80), _row(workers, (12, 8), seed=0, hits=76)]
    table = markdown(rows, "llm-gateway bench instances")
    line = next(x for x in table.splitlines() if "2 workers" in x)
    assert "| 0.760 | 0.950x | 1.20 | +0.20 |" in line
