"""The desired-replica signal an HPA scales on."""

from __future__ import annotations

from router_policies.autoscale import (
    CapacityMeter,
    RateMeter,
    ScaleDownStabilizer,
    desired_replicas,
)
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
    assert desired_replicas(0, queue_depth=50, mean_kv_usage=0.0, settings=S) == 1


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
