"""The desired-replica signal an HPA scales on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router_policies.autoscale import (
    CapacityMeter,
    RateMeter,
    ScaleDownStabilizer,
    desired_replicas,
)
from router_policies.capacity import (
    CapacityEstimate,
    Workload,
    WorkloadMeter,
    batch_size,
    decode_steps,
    full_batch_capacity,
)
from router_policies.cost.rates import Rates
from router_policies.schema import AutoscaleSettings

S = AutoscaleSettings(
    target_queue_per_replica=4, kv_usage_ceiling=0.8, min_replicas=1, max_replicas=10
)


def test_an_idle_pool_shrinks_to_the_minimum() -> None:
    assert desired_replicas(4, queue_depth=0, mean_kv_usage=0.0, settings=S) == 1


def test_queue_above_target_grows_the_pool_in_proportion() -> None:
    # 32 waiting on 4 replicas is 8 each, twice the target.
    assert desired_replicas(4, queue_depth=32, mean_kv_usage=0.1, settings=S) == 8


def test_kv_pressure_alone_grows_the_pool() -> None:
    assert desired_replicas(4, queue_depth=0, mean_kv_usage=0.8, settings=S) == 4
    assert desired_replicas(4, queue_depth=0, mean_kv_usage=1.0, settings=S) == 5


def test_bounds_hold() -> None:
    assert desired_replicas(4, queue_depth=10_000, mean_kv_usage=1.0, settings=S) == 10
    assert desired_replicas(0, queue_depth=50, mean_kv_usage=0.0, settings=S) == 10


def test_scale_down_waits_for_the_stabilization_window() -> None:
    stabilizer = ScaleDownStabilizer(window_s=300)
    assert stabilizer.recommend(0, 8) == 8
    assert stabilizer.recommend(10, 12) == 12  # up at once
    assert stabilizer.recommend(20, 3) == 12  # down only after the window
    assert stabilizer.recommend(309, 3) == 12
    assert stabilizer.recommend(311, 3) == 3


RATED = AutoscaleSettings(
    target_rate_per_replica=10, backlog_drain_s=100, kv_usage_ceiling=0.8, max_replicas=64
)


def test_with_a_target_rate_the_load_term_follows_arrivals_not_backlog() -> None:
    # 45 req/s at 10 per replica: 5 replicas, however many happen to be up right now.
    assert (
        desired_replicas(2, queue_depth=0, mean_kv_usage=0.1, settings=RATED, arrival_rate=45) == 5
    )
    assert (
        desired_replicas(9, queue_depth=0, mean_kv_usage=0.1, settings=RATED, arrival_rate=45) == 5
    )


def test_an_outage_keeps_asking_for_what_the_demand_needs() -> None:
    # Every replica down while 45 req/s keep arriving: still 5, not 1 (an HPA would follow).
    assert (
        desired_replicas(0, queue_depth=0, mean_kv_usage=0.0, settings=RATED, arrival_rate=45) == 5
    )
    # Before any capacity is known, the requests waiting are the demand.
    assert desired_replicas(0, queue_depth=32, mean_kv_usage=0.0, settings=S) == 8


def test_a_pool_scaled_to_zero_stays_there_until_a_request_comes() -> None:
    none_kept = RATED.model_copy(update={"min_replicas": 0})
    assert desired_replicas(0, queue_depth=0, mean_kv_usage=0.0, settings=none_kept) == 0
    assert desired_replicas(3, queue_depth=0, mean_kv_usage=0.0, settings=none_kept) == 0
    # Any demand while nothing serves asks for one, however little: the pool comes back.
    for waiting, arriving in ((1, 0.0), (0, 0.01)):
        wanted = desired_replicas(0, waiting, 0.0, none_kept, arrival_rate=arriving)
        assert wanted == 1


@pytest.mark.parametrize("broken", [math.nan, -5.0, math.inf, -math.inf])
def test_a_broken_figure_never_makes_the_signal_raise(broken: float) -> None:
    learned = RATED.model_copy(update={"target_rate_per_replica": None})
    for settings, capacity in ((S, None), (RATED, None), (learned, broken)):
        for healthy in (0, 2):
            desired = desired_replicas(
                healthy, broken, broken, settings, arrival_rate=broken, capacity=capacity
            )
            assert settings.min_replicas <= desired <= settings.max_replicas


def test_a_backlog_adds_the_replicas_that_drain_it_in_time() -> None:
    # 1,000 waiting over 100 s is 10 req/s more: one more replica, not a hundred.
    assert (
        desired_replicas(5, queue_depth=1000, mean_kv_usage=0.1, settings=RATED, arrival_rate=45)
        == 6
    )


def test_the_rate_meter_reads_like_promql_rate() -> None:
    meter = RateMeter(window_s=60)
    assert meter.rate(0, 0) == 0.0
    for t in range(1, 121):
        rate = meter.rate(t, 5 * t)  # 5 per second throughout
    assert rate == 5.0
    for t in range(121, 181):
        rate = meter.rate(t, 600)  # then nothing arrives for a full window
    assert rate == 0.0


# --- the capacity the gateway learns, for a pool with no target rate configured -------------


def saturated_pool(meter: CapacityMeter, per_replica: float, healthy: int, seconds: int) -> None:
    """Feed the meter one round a second of a pool completing per_replica req/s per replica
    with a request waiting on every replica."""
    completions = 0.0
    for t in range(seconds):
        completions += per_replica * healthy
        meter.update(float(t), int(completions), healthy, queue_depth=healthy * 3)


def test_capacity_is_learned_from_completions_while_saturated() -> None:
    meter = CapacityMeter(window_s=10)
    saturated_pool(meter, per_replica=9.0, healthy=2, seconds=40)
    assert meter.value is not None and abs(meter.value - 9.0) < 0.5


def test_no_capacity_is_learned_from_a_pool_that_is_not_saturated() -> None:
    meter = CapacityMeter(window_s=10)
    for t in range(60):
        meter.update(float(t), completions=t * 6, healthy=2, queue_depth=0)
    assert meter.value is None


def test_a_new_window_keeps_what_was_measured_and_trims_it() -> None:
    stabilizer = ScaleDownStabilizer(window_s=60)
    stabilizer.recommend(0, 8)
    stabilizer.retime(300)  # longer: the peak is still held
    assert stabilizer.recommend(100, 3) == 8
    stabilizer.retime(60)  # shorter: held no longer than the new window
    assert stabilizer.recommend(101, 3) == 3
    rates = RateMeter(window_s=60)
    for t in range(0, 61, 10):
        rates.rate(float(t), t * 5)
    rates.retime(10)
    assert rates.rate(70.0, 400) == pytest.approx(10.0)  # over the last 10 s alone
    capacity = CapacityMeter(window_s=10)
    saturated_pool(capacity, per_replica=9.0, healthy=2, seconds=40)
    learned = capacity.value
    capacity.retime(30)  # the capacity kept; a saturation must last the new window again
    completions = 40 * 18
    for t in range(40, 60):
        completions += 2 * 3  # slower now: no sample of it yet
        capacity.update(float(t), completions, 2, queue_depth=6)
    assert learned is not None and capacity.value == learned


def test_a_change_of_healthy_replicas_restarts_the_window() -> None:
    meter = CapacityMeter(window_s=10)
    saturated_pool(meter, per_replica=9.0, healthy=2, seconds=8)
    meter.update(8.0, 150, healthy=6, queue_depth=100)  # new replicas: old completions mislead
    assert meter.value is None


def test_the_learned_capacity_drives_the_rate_term() -> None:
    settings = AutoscaleSettings(target_utilization=0.8, max_replicas=64)
    # 48 req/s at 0.8 x 9 req/s per replica: 6.67 -> 7 replicas; the queue adds its drain.
    assert desired_replicas(2, 0, 0.0, settings, arrival_rate=48.0, capacity=9.0) == 7
    assert desired_replicas(2, 1200, 0.0, settings, arrival_rate=48.0, capacity=9.0) == 9
    # A configured target wins over the learned capacity.
    fixed = settings.model_copy(update={"target_rate_per_replica": 4.0})
    assert desired_replicas(2, 0, 0.0, fixed, arrival_rate=48.0, capacity=9.0) == 12


def test_forgetting_drops_recommendations_made_blind() -> None:
    stabilizer = ScaleDownStabilizer(window_s=300)
    assert stabilizer.recommend(0.0, 64) == 64
    stabilizer.forget()
    assert stabilizer.recommend(1.0, 9) == 9


# -- the capacity estimate before saturation (router_policies/capacity.py) ---------------------

# The scaling benchmark's engine: 8 ms + 0.2 ms per sequence a decode step, 20k prefill tokens/s,
# 1024 prompt + 256 output tokens; the fluid model gives 9.08 req/s at a batch of 256.
ENGINE = Rates(prefill_s_per_token=5e-5, step_s=0.008, decode_s_per_seq=0.0002)
# 255 decode steps seen at 25 running: 255 x (8 ms + 25 x 0.2 ms) = 3.315 s.
MEAN = Workload(prompt_tokens=1024, decode_s=255 * 0.013, decode_running=25)


def test_decode_steps_come_from_decode_time_over_the_step_time() -> None:
    assert decode_steps(MEAN, ENGINE) == pytest.approx(255)


@pytest.mark.parametrize(
    ("case", "rates", "workload", "batch", "expected"),
    [
        ("the engine model at a full batch", ENGINE, MEAN, 256, 9.08),
        (
            "a replica 2x slower in decode has half the decode capacity",
            replace(ENGINE, step_s=0.016, decode_s_per_seq=0.0004, prefill_s_per_token=1e-9),
            # the same output length, seen as twice the decode time
            replace(MEAN, prompt_tokens=0, decode_s=2 * MEAN.decode_s),
            256,
            0.5 * full_batch_capacity(ENGINE, 256, replace(MEAN, prompt_tokens=0)),
        ),
        (
            "a fully cached prompt costs no prefill",
            ENGINE,
            replace(MEAN, prompt_tokens=0),
            256,
            256 / (255 * (0.008 + 256 * 0.0002)),
        ),
        ("one sequence at a time", ENGINE, MEAN, 1, 1 / (1024 * 5e-5 + 255 * 0.0082)),
    ],
)
def test_full_batch_capacity(
    case: str, rates: Rates, workload: Workload, batch: float, expected: float
) -> None:
    assert full_batch_capacity(rates, batch, workload) == pytest.approx(expected, rel=0.01), case


def test_a_larger_batch_serves_more_but_less_than_in_proportion() -> None:
    small = full_batch_capacity(ENGINE, 128, MEAN)
    large = full_batch_capacity(ENGINE, 256, MEAN)
    assert small < large < 2 * small


@pytest.mark.parametrize(
    ("case", "slots", "kv_capacity", "expected"),
    [
        ("the batch the queue showed", 128.0, None, 128),
        ("unknown batch size uses the configured batch_slots (256)", math.inf, None, 256),
        ("never more than the KV cache holds under its ceiling", math.inf, 200_000, 140.625),
        ("at least one sequence", math.inf, 100, 1),
    ],
)
def test_batch_size(case: str, slots: float, kv_capacity: int | None, expected: float) -> None:
    fallback = AutoscaleSettings().batch_slots
    assert batch_size(slots, fallback, 1280, kv_capacity, 0.9) == pytest.approx(expected), case


def test_the_workload_is_unknown_until_enough_decodes_were_seen() -> None:
    meter = WorkloadMeter(min_samples=3)
    for _ in range(2):
        meter.observe(1024, 3.3, 25)
    meter.observe(1024, None, 25)  # not streamed: no decode time
    assert meter.value() is None
    meter.observe(1024, 3.3, 25)
    assert meter.value() == Workload(1024, 3.3, 25)


def test_the_estimate_holds_through_saturation_and_its_aftermath() -> None:
    estimate = CapacityEstimate(quiet_s=30, weight=1.0)
    assert estimate.update(0, [9.0, 10.0], saturated=False) == 9.5
    # Slot waits read as slow prefill: the rates' estimate drops, the held value does not.
    assert estimate.update(10, [2.0], saturated=True) == 9.5
    assert estimate.update(30, [3.0], saturated=False) == 9.5
    assert estimate.update(41, [8.0], saturated=False) == 8.0


def test_with_no_target_rate_a_capacity_makes_the_rate_term_run() -> None:
    # 48 req/s at 0.8 x 9.08 per replica: 7 replicas, though 2 are up and nothing is queued.
    settings = AutoscaleSettings(max_replicas=64)
    assert desired_replicas(2, 0, 0.1, settings, arrival_rate=48, capacity=9.08) == 7
    assert desired_replicas(2, 0, 0.1, settings, arrival_rate=48) == 1
