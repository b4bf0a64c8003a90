"""A replica's batch size, inferred from the (running, waiting) pairs of its scrapes."""

from __future__ import annotations

import math

import pytest

from router_policies.batch_slots import BatchSlots


@pytest.mark.parametrize(
    ("scrapes", "slots"),
    [
        pytest.param([], math.inf, id="never scraped: unbounded"),
        pytest.param([(1, 1)], math.inf, id="one request waiting for the next step is no limit"),
        pytest.param(
            [(1, 1), (0, 0), (3, 1), (5, 0)], math.inf, id="passing queues never twice in a row"
        ),
        pytest.param([(1, 1), (4, 2)], math.inf, id="a queue the batch grew past is passing"),
        pytest.param([(16, 3), (16, 5)], 16, id="a queue behind a batch that cannot grow"),
        pytest.param([(16, 3), (15, 4)], 16, id="the batch shrank with a queue: full"),
        pytest.param([(8, 2), (8, 2), (12, 0)], 12, id="never smaller than seen running"),
        pytest.param([(16, 3), (16, 5), (8, 4), (8, 4)], 16, id="a smaller full batch is KV-bound"),
        pytest.param(
            [(100, 0), (120, 0), (8, 5), (8, 5)], 120, id="a first queue behind a smaller batch"
        ),
    ],
)
def test_slots_from_scrapes(scrapes: list[tuple[float, float]], slots: float) -> None:
    inferred = BatchSlots()
    for running, waiting in scrapes:
        inferred.observe(running, waiting)
    assert inferred.value == slots
