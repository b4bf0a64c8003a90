"""Overflow by prediction: while the small pool has a queue, an easy request climbs to the large
pool when the large pool is predicted to answer it sooner, before the small one saturates. Hard
requests never go down by prediction (only at saturation, when allowed), and an unqueued small
pool costs no prediction."""

from __future__ import annotations

import time

from gateway.routing.explain import comparison_view
from router_policies.decision import Route
from router_policies.schema import CostSettings
from router_policies.tier_settings import OverflowSettings, TierSettings
from router_policies.tiers import (
    PoolChoice,
    PoolLoad,
    PoolPrediction,
    Tier,
    climb_choice,
    may_climb,
)
from tests.tiers import EASY, HARD, SLOW, ask, busy, fleet, resolved

ON = OverflowSettings(predicted=True)
SETTINGS = TierSettings(small="small", large="large", overflow=ON)
NEAR = CostSettings().near_ratio
IDLE = PoolLoad(healthy=1, queue_depth=0, saturation_queue_per_replica=8)
QUEUED = PoolLoad(healthy=1, queue_depth=2, saturation_queue_per_replica=8)
BACKLOGGED = PoolLoad(healthy=1, queue_depth=0, saturation_queue_per_replica=8, backlogged=True)
FULL = PoolLoad(healthy=1, queue_depth=8, saturation_queue_per_replica=8)


def test_an_easy_request_climbs_only_where_the_large_pool_answers_sooner_beyond_the_band() -> None:
    small = PoolChoice("small", overflow=False)
    climbed = PoolChoice("large", overflow=True)
    queued_small = PoolPrediction(1.2, 0.1)
    assert (
        climb_choice(small, SETTINGS, queued_small, PoolPrediction(0.3, 0.3), IDLE, NEAR) == climbed
    )
    sooner_within_band = PoolPrediction(1.2 / (1 + NEAR) + 0.01, 0.3)
    assert climb_choice(small, SETTINGS, queued_small, sooner_within_band, IDLE, NEAR) == small
    assert (
        climb_choice(small, SETTINGS, queued_small, PoolPrediction(1.5, 0.3), IDLE, NEAR) == small
    )
    assert (
        climb_choice(small, SETTINGS, queued_small, PoolPrediction(0.3, 0.3), FULL, NEAR) == small
    )
    assert climb_choice(small, SETTINGS, None, PoolPrediction(0.3, 0.3), IDLE, NEAR) == small


def test_only_an_easy_request_with_a_queue_on_the_small_pool_is_predicted_for() -> None:
    assert may_climb(Tier.SMALL, SETTINGS, QUEUED)
    assert may_climb(Tier.SMALL, SETTINGS, BACKLOGGED)
    assert not may_climb(Tier.SMALL, SETTINGS, IDLE)
    assert not may_climb(Tier.LARGE, SETTINGS, QUEUED)
    for off in (OverflowSettings(), OverflowSettings(enabled=False, predicted=True)):
        assert not may_climb(Tier.SMALL, TierSettings(small="s", large="l", overflow=off), QUEUED)


def test_a_queued_small_pool_sends_easy_requests_to_an_idle_large_one_before_it_saturates() -> None:
    built = fleet(large_cost=SLOW, overflow={"predicted": True})
    busy(built, "small")  # a backlog of prefills, nothing queued in the engine yet
    small = built.pools["small"].load(backlog=True)
    assert small.backlogged and not small.saturated
    assert ask(built, EASY) == ("large", Route.OVERFLOW, "small")
    busy(built, "large")  # now the large pool would answer no sooner
    assert ask(built, EASY) == ("small", None, "small")


def test_while_a_small_replica_can_start_at_once_an_easy_request_stays_unpredicted() -> None:
    built = fleet(overflow={"predicted": True})
    busy(built, "small", pending=0)  # decoding, but nothing waits for a first token
    resolution = resolved(built, EASY)
    assert (resolution.pool.name, resolution.compared) == ("small", ())


def test_by_default_an_easy_request_climbs_at_saturation_only() -> None:
    built = fleet()
    busy(built, "small")
    assert not built.pools["small"].load().backlogged  # off: the pass over replicas is skipped
    assert ask(built, EASY) == ("small", None, "small")
    for replica in built.pools["small"].replicas.values():
        replica.engine.waiting = 8  # saturated: 8 queued per replica
    assert ask(built, EASY) == ("large", Route.OVERFLOW, "small")


def test_requests_waiting_in_other_workers_and_instances_count_toward_saturation() -> None:
    built = fleet()
    small = built.pools["small"]
    small.counts.remote.waiting = 8  # the other processes' queues, read from the shared state
    assert small.load().saturated
    assert ask(built, EASY) == ("large", Route.OVERFLOW, "small")


def test_an_easy_request_overflows_from_a_small_pool_whose_replicas_are_all_ejected() -> None:
    built = fleet()
    small = built.pools["small"]
    for replica in small.replicas.values():
        replica.outlier.ejected_until = time.monotonic() + 60  # failing every request
    assert ask(built, EASY) == ("large", Route.OVERFLOW, "small")
    # Ejected, not down: still replicas that exist, for the autoscaler.
    assert (small.load().healthy, len(small.healthy())) == (0, 1)


def test_an_ejected_replicas_queue_does_not_make_its_pool_look_saturated() -> None:
    built = fleet(small_replicas=2)
    small = built.pools["small"]
    backed_up, _ = small.replicas.values()
    backed_up.engine.waiting = 50  # far past the saturation line for two replicas
    backed_up.outlier.ejected_until = time.monotonic() + 60  # nothing more goes there
    assert ask(built, EASY) == ("small", None, "small")  # the other replica is idle


def test_a_hard_request_never_goes_down_by_prediction() -> None:
    for overflow in ({"predicted": True}, {"predicted": True, "allow_degrade": True}):
        built = fleet(overflow=overflow)
        busy(built, "large")
        assert ask(built, HARD) == ("large", None, "large")


def test_admin_route_shows_the_predictions_a_climb_read() -> None:
    built = fleet(large_cost=SLOW, overflow={"predicted": True})
    busy(built, "small")
    resolution = resolved(built, EASY)
    view = comparison_view(resolution.compared, resolution.compared_for)
    assert view["close_call"] is None and view["overflow"] is not None
    assert list(view["overflow"]) == ["small", "large"]  # its tier's pool first
    small, large = view["overflow"]["small"], view["overflow"]["large"]
    assert large["predicted_ttft_s"] * (1 + NEAR) < small["predicted_ttft_s"]  # why it climbed
