"""`llm-gateway bench soak`: a short run end to end, and what its report says."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import soak


def args(tmp_path: Path, duration_s: float) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    return parser.parse_args(
        ["--duration-s", str(duration_s), "--sample-every-s", "1", "--concurrency", "4",
         "--out", str(tmp_path / "soak.md"), "--plot", str(tmp_path / "soak.png")]
    )  # fmt: skip


def test_a_short_soak_writes_its_report_and_plot(tmp_path: Path) -> None:
    assert soak.run(args(tmp_path, 3.0)) == 0
    text = (tmp_path / "soak.md").read_text()
    assert "Command: `llm-gateway bench soak" in text and "Gateway RSS:" in text
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "failed" not in text


def test_the_report_names_failures_and_where_the_evidence_is(tmp_path: Path) -> None:
    samples = [
        soak.Sample(0, 0, 50.0, 4000, 20),
        soak.Sample(5, 400, 51.0, 7000, 60),  # the warm-up sample (a fifth of the run in)
        soak.Sample(10, 900, 52.0, 7000, 60),
    ]
    tally = soak.Tally(requests=900, by_status={200: 890, 500: 10}, kept_log=Path("/tmp/gw.log"))
    text = soak.report(samples, tally, args(tmp_path, 10), "llm-gateway bench soak")
    assert "**10 requests failed**" in text and "/tmp/gw.log" in text
    assert "+1.0 MiB after warm-up" in text
