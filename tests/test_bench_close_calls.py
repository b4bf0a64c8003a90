"""`llm-gateway bench close-calls`: the like-for-like baseline sends the same share large as
the close calls did, and the offline share (the workload's scores, conversation memory
included) is what the gateway itself routes."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.close_calls import Workload, build_workload, measure, report_over_seeds, table


def test_a_conversation_that_went_large_stays_large_in_the_offline_share() -> None:
    workload = Workload((), (), ((0.9, 0.1, 0.2), (0.1, 0.2)))
    assert workload.share_large(0.5) == 3 / 5
    assert workload.share_large(0.15) == 4 / 5  # the second conversation goes large on turn 2
    assert workload.within(0.5, 0.35) == 2 / 5  # the two turns scored 0.2


def test_the_report_folder_is_made_before_the_seeds_run(tmp_path: Path) -> None:
    out = tmp_path / "new" / "report.md"
    made_first: list[bool] = []

    def section(seed: int) -> str:
        made_first.append(out.parent.is_dir())
        return f"seed {seed}\n"

    args = argparse.Namespace(seeds=(1, 2), out=out)  # as --seeds 1,2 parses
    assert report_over_seeds(args, "Title", "llm-gateway bench x", "Lead.\n\nBody.", section) == 0
    assert made_first == [True, True]  # a bad --out fails before minutes of work, not after
    assert out.read_text().count("seed ") == 2 and "Body." in out.read_text()


def test_the_matched_threshold_sends_the_asked_share_large() -> None:
    workload = build_workload(60, 4.0, seed=0)
    shares = [workload.share_large(t / 20) for t in range(21)]
    assert shares == sorted(shares, reverse=True)
    for share in (0.2, 0.3, 0.5):
        assert abs(workload.share_large(workload.threshold_for(share)) - share) <= 0.05


async def test_the_gateway_routes_the_quality_rule_as_the_offline_share_says() -> None:
    workload = build_workload(10, 20.0, seed=0)
    quality, close, same = await measure(workload, margin=0.02)
    for outcome in (quality, close, same):
        assert len(outcome.ok()) == workload.requests
    assert quality.close_calls() == same.close_calls() == 0
    assert quality.share_large() == workload.share_large(quality.threshold)
    assert same.share_large() == workload.share_large(same.threshold)
    opened = sum(turns[0] > quality.threshold for turns in workload.scores)
    assert quality.first_turns_large() == opened
    assert abs(same.share_large() - close.share_large()) <= 1 / workload.requests + 0.05
    text = table([quality, close, same])
    assert "| quality rule |" in text and "| close calls |" in text
