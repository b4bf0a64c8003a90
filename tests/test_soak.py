"""`llm-gateway bench soak`: a short run end to end, and what its report says."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import soak


def args(tmp_path: Path, duration_s: float, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    return parser.parse_args(
        ["--duration-s", str(duration_s), "--sample-every-s", "1", "--concurrency", "4",
         "--out", str(tmp_path / "soak.md"), "--plot", str(tmp_path / "soak.png"), *extra]
    )  # fmt: skip


def test_a_short_soak_writes_its_report_and_plot(tmp_path: Path) -> None:
    assert soak.run(args(tmp_path, 3.0)) == 0
    text = (tmp_path / "soak.md").read_text()
    assert "Command: `llm-gateway bench soak" in text and "Gateway RSS:" in text
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "failed" not in text


def test_a_distinct_soak_stops_at_its_request_bound_and_finds_no_secret_in_the_debug_log(
    tmp_path: Path,
) -> None:
    assert soak.run(args(tmp_path, 60.0, "--distinct", "--requests", "300")) == 0
    text = (tmp_path / "soak.md").read_text()
    assert "Requests answered: 300 " in text
    assert "0 with the API key, 0 with the Redis password, 0 with a prompt" in text


def test_a_log_holding_a_secret_fails_the_soak(tmp_path: Path) -> None:
    hidden = soak.Secrets()
    log = tmp_path / "gateway.log"
    log.write_text(f"ok\nconnecting to redis://:{hidden.redis_password}@host\n")
    found = soak.search_log(log, hidden)
    assert (found.lines, found.with_password, found.clean) == (2, 1, False)
    assert not soak.Tally(requests=1, by_status={200: 1}, log_search=found).ok()


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
