"""`llm-gateway bench priority`, in miniature: under overload the sheddable class is refused
and the high class is kept, on the same arrivals as a run without priorities."""

from __future__ import annotations

import argparse

import pytest

from bench.priority import measure, report


@pytest.mark.timeout(120)
async def test_under_overload_only_the_sheddable_are_refused_and_the_high_are_served() -> None:
    args = argparse.Namespace(load=1.6, seconds=4.0, objective_s=2.0, seed=3)
    rows, capacity = await measure(args)
    by = {(row.run, row.kind): row.results for row in rows}
    high, sheddable = by[("priority", "high")], by[("priority", "sheddable")]
    assert high and sheddable
    assert all(r.ok for r in high)
    assert any(r.status == 429 for r in sheddable)
    assert not any(r.status == 429 for r in by[("no priority", "sheddable")])
    text = report(rows, args, capacity)
    assert text.count("| priority | ") == 2 and text.count("| no priority | ") == 2
