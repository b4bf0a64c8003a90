"""Token-bucket arithmetic (router_policies/rate_limit.py): plain values, exact times."""

import pytest

from router_policies.rate_limit import (
    Bucket,
    Limit,
    adjust,
    format_reset,
    refilled,
    take,
)

RPM_60 = Limit(60)  # one per second
RPM_3 = Limit(3)  # one per 20 s


@pytest.mark.parametrize(
    ("bucket", "limit", "now", "used"),
    [
        (None, RPM_60, 5.0, 0.0),  # never seen: full, nothing used
        (Bucket(60.0, 0.0), RPM_60, 1.5, 58.5),  # refills at size/60 per second
        (Bucket(3.0, 0.0), RPM_3, 20.0, 2.0),
        (Bucket(50.0, 0.0), RPM_60, 1000.0, 0.0),  # never above its size
        (Bucket(5.0, 0.0), RPM_3, 40.0, 3.0),  # a debt (used > size) is paid back alike
        (Bucket(600.0, 0.0), RPM_3, 0.0, 6.0),  # used under a larger size: one bucket's debt
        (Bucket(55.0, 10.0), RPM_60, 9.0, 55.0),  # a clock stepping back refills nothing
    ],
)
def test_a_bucket_refills_at_its_size_per_minute_up_to_its_size(
    bucket: Bucket | None, limit: Limit, now: float, used: float
) -> None:
    assert refilled(bucket, limit, now).used == pytest.approx(used)


def _run(limits: list[Limit], steps: list[tuple[float, list[float]]]) -> list[bool]:
    buckets: list[Bucket | None] = [None] * len(limits)
    allowed = []
    for now, costs in steps:
        verdict = take(buckets, limits, costs, now)
        buckets = list(verdict.buckets)
        allowed.append(verdict.allowed)
    return allowed


@pytest.mark.parametrize(
    ("limits", "steps", "allowed"),
    [
        # A full bucket of 3 admits a burst of 3, then one more each 20 s.
        ([RPM_3], [(0, [1])] * 4, [True, True, True, False]),
        ([RPM_3], [(0, [1])] * 3 + [(19.9, [1]), (20.0, [1])], [True] * 3 + [False, True]),
        # Two buckets: all or nothing. The token bucket refuses, so no request is taken either.
        (
            [RPM_3, Limit(100)],
            [(0, [1, 60]), (0, [1, 60]), (0, [1, 40]), (0, [1, 0])],
            [True, False, True, True],
        ),
        # A cost above the size is admitted from a full bucket only, and leaves a debt of one
        # bucket at most: a minute later the bucket holds something again.
        ([Limit(100)], [(0, [250]), (59.9, [1]), (61, [1]), (210, [1])], [True, False, True, True]),
        ([Limit(100)], [(0, [1]), (0, [250])], [True, False]),
        # A zero cost is always admitted.
        ([Limit(1)], [(0, [1]), (0, [0])], [True, True]),
    ],
)
def test_take_admits_while_every_bucket_holds_the_cost(
    limits: list[Limit], steps: list[tuple[float, list[float]]], allowed: list[bool]
) -> None:
    assert _run(limits, steps) == allowed


def test_a_refusal_says_when_to_retry_and_what_is_left() -> None:
    buckets: list[Bucket | None] = [Bucket(2.75, 0.0), Bucket(50.0, 0.0)]
    verdict = take(buckets, [RPM_3, Limit(100)], [1, 80], now=0.0)
    assert not verdict.allowed
    # Requests: 0.75 missing at 0.05/s = 15 s; tokens: 30 missing at 100/60 per s = 18 s.
    assert verdict.retry_after_s == pytest.approx(18.0)
    assert [v.remaining for v in verdict.views] == [0.25, 50.0]
    assert [v.reset_s for v in verdict.views] == pytest.approx([55.0, 30.0])
    assert verdict.buckets == (Bucket(2.75, 0.0), Bucket(50.0, 0.0))  # nothing taken


def test_a_limit_changed_by_a_reload_applies_at_once_to_what_was_used() -> None:
    spent = Bucket(1.0, 0.0)  # one request of a 1-per-minute limit, just now
    assert not take([spent], [Limit(1)], [1], now=0.0).allowed
    raised = take([spent], [Limit(10)], [1], now=0.0)
    assert raised.allowed and raised.views[0].remaining == 8
    assert not take([Bucket(5.0, 0.0)], [Limit(4)], [1], now=0.0).allowed  # lowered


def test_an_admission_reports_the_remaining_and_the_time_to_full() -> None:
    verdict = take([None, None], [RPM_60, Limit(6000)], [1, 1500], now=0.0)
    assert verdict.allowed
    assert [(v.limit, v.remaining) for v in verdict.views] == [(60, 59), (6000, 4500)]
    assert [v.reset_s for v in verdict.views] == pytest.approx([1.0, 15.0])


@pytest.mark.parametrize(
    ("used", "delta", "after"),
    [
        (50.0, 30.0, 80.0),  # used more than estimated: taken
        (50.0, -30.0, 20.0),  # used less: refunded
        (10.0, -30.0, 0.0),  # a refund never fills past the size
        (90.0, 500.0, 200.0),  # a debt never goes past one full bucket
    ],
)
def test_adjust_corrects_an_estimate_within_bounds(used: float, delta: float, after: float) -> None:
    assert adjust(Bucket(used, 0.0), Limit(100), delta, now=0.0).used == after


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.0201, "21ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (59.9994, "1m0s"),
        (59.9986, "59.999s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (61.25, "1m1.25s"),
    ],
)
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text
