"""`llm-gateway bench hang`: when throughput counts as back after a worker stopped."""

from __future__ import annotations

from bench.hang import recovery_s, report


def test_recovery_is_the_first_whole_second_at_80_percent_of_one_worker() -> None:
    one = 100.0  # requests/s of one worker alone; bins are half-seconds
    bins = [60, 60, 60, 10, 0, 0, 30, 50, 50, 50]
    # Stopped at 1.5 s: [10, 0], [0, 0], [0, 30] fall short; [30, 50] from 3.0 s is 80.
    assert recovery_s(one, bins, stopped_at=1.5) == 1.5
    assert "1.5 s after the stop" in report(one, bins, 1.5)


def test_a_fleet_that_never_recovers_says_so() -> None:
    bins = [60, 60, 0, 0, 0, 40]
    assert recovery_s(100.0, bins, stopped_at=1.0) is None
    assert "Never back" in report(100.0, bins, 1.0)
