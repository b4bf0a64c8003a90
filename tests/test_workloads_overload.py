"""The overload workload: arrivals that follow its phases (a burst above the fleet's rate,
then recovery below it), seeded and scaled down in time, idle phases getting none, each arrival
a single-turn shared-prefix request."""

from __future__ import annotations

import itertools

import pytest

from bench.workloads import CHARS_PER_TOKEN, split_schedule
from bench.workloads_overload import OVERLOAD_PHASES, Phase, overload, phase_arrivals, phase_of


def test_overload_follows_its_phases() -> None:
    arrivals = phase_arrivals(50.0, OVERLOAD_PHASES, seed=2)
    assert arrivals == phase_arrivals(50.0, OVERLOAD_PHASES, seed=2)
    assert arrivals != phase_arrivals(50.0, OVERLOAD_PHASES, seed=3)
    assert all(b > a for a, b in itertools.pairwise(arrivals))
    assert 0 < arrivals[0] and arrivals[-1] < 120
    burst = sum(1 for at in arrivals if at < 60)
    recovery = len(arrivals) - burst
    # 60 s at 1.3 x 50/s and 60 s at 0.6 x 50/s (Poisson: within 5 standard deviations).
    assert burst == pytest.approx(3900, abs=5 * 3900**0.5)
    assert recovery == pytest.approx(1800, abs=5 * 1800**0.5)


def test_overload_scales_down_in_time() -> None:
    phases = (Phase(10.0, 1.3), Phase(0.0, 5.0), Phase(10.0, 0.0), Phase(10.0, 0.6))
    arrivals = phase_arrivals(20.0, phases, seed=1, time_scale=0.5)
    assert arrivals[-1] < 15.0
    # The idle phase (load 0, 5 s once scaled) gets no arrivals.
    assert not [at for at in arrivals if 5.0 <= at < 10.0]
    assert [phase_of(at, phases, 0.5) for at in (0.1, 7.0, 14.0, 99.0)] == [0, 2, 3, 3]
    with pytest.raises(ValueError):
        phase_arrivals(0.0, phases)


def test_overload_requests_are_shared_prefix_requests() -> None:
    schedule = overload(
        8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4, groups=4, system_tokens=64,
        question_tokens=8, output_tokens=3,
    )  # fmt: skip
    assert schedule == overload(
        8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4, groups=4, system_tokens=64,
        question_tokens=8, output_tokens=3,
    )  # fmt: skip
    arrivals, conversations = split_schedule(schedule)
    assert arrivals == phase_arrivals(8.0, (Phase(5.0, 1.3), Phase(5.0, 0.6)), seed=4)
    assert all(c.rounds == 1 and c.max_tokens == 3 for c in conversations)
    assert all(len(c.system) == 64 * CHARS_PER_TOKEN for c in conversations)
    assert len({c.group for c in conversations}) == 4
    assert all(len({c.system for c in conversations if c.group == g}) == 1 for g in range(4))
    assert len({c.questions[0] for c in conversations}) == len(conversations)
