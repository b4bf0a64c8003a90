"""Close calls: a tiered request scored within `close_call_margin` of the threshold goes to the
pool where it would wait least for that pool's speed, each pool's policy routing it as it would
now (a queue, or history held there, moves it; a faster model alone does not); outside the
margin, forced, kept large by its conversation or overflowing, the tier decides alone."""

from __future__ import annotations

import orjson
import pytest

from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.explain import comparison_view
from gateway.routing.resolve import resolve
from router_policies.decision import Route
from router_policies.schema import CostSettings
from router_policies.tier_settings import TierSettings
from router_policies.tiers import PoolChoice, PoolLoad, PoolPrediction, close_call_choice
from tests.tiers import EASY, HARD, SLOW, ask, busy, conversation_key, dialogue, fleet, resolved

IDLE = PoolLoad(healthy=1, queue_depth=0, saturation_queue_per_replica=8)
SETTINGS = TierSettings(small="small", large="large", close_call_margin=0.1)
NEAR = CostSettings().near_ratio


def test_a_close_call_leaves_its_tier_only_to_wait_less_for_the_speed_and_answer_no_later() -> None:
    own = PoolChoice("large", overflow=False)
    moved = PoolChoice("small", overflow=False, close_call=True)
    # Both idle and cold: the small model answers sooner, but only because it is small.
    idle_large, idle_small = PoolPrediction(0.9, 0.9), PoolPrediction(0.3, 0.3)
    assert close_call_choice(own, SETTINGS, idle_large, idle_small, IDLE, NEAR) == own
    backed_up = PoolPrediction(2.7, 0.9)
    assert close_call_choice(own, SETTINGS, backed_up, idle_small, IDLE, NEAR) == moved
    holds_history = PoolPrediction(0.06, 0.3)  # most of the prompt cached there
    assert close_call_choice(own, SETTINGS, idle_large, holds_history, IDLE, NEAR) == moved
    assert (
        close_call_choice(own, SETTINGS, PoolPrediction(0.2, 0.9), holds_history, IDLE, NEAR) == own
    )
    queued_small = PoolPrediction(0.48, 0.3)  # a queue on the fast model...
    own_small = PoolChoice("small", overflow=False)
    assert close_call_choice(own_small, SETTINGS, queued_small, idle_large, IDLE, NEAR) == own_small
    # ...sends it to the slow one only where it would answer no later: history held there.
    to_large = PoolChoice("large", overflow=False, close_call=True)
    warm_large = PoolPrediction(0.4, 0.9)
    assert close_call_choice(own_small, SETTINGS, queued_small, warm_large, IDLE, NEAR) == to_large
    slightly_busier = PoolPrediction(1.0, 0.9)  # within the band of equally good predictions
    assert close_call_choice(own, SETTINGS, slightly_busier, idle_small, IDLE, NEAR) == own
    assert close_call_choice(own, SETTINGS, None, idle_small, IDLE, NEAR) == own  # no cost model
    full = PoolLoad(healthy=1, queue_depth=8, saturation_queue_per_replica=8)
    assert close_call_choice(own, SETTINGS, backed_up, idle_small, full, NEAR) == own


@pytest.mark.parametrize("loaded", ["small", "large"])
def test_with_every_request_a_close_call_the_idle_pool_answers(loaded: str) -> None:
    built = fleet(margin=0.5)  # every score is within 0.5 of the 0.5 threshold
    busy(built, loaded)
    idle = "large" if loaded == "small" else "small"
    for text in (EASY, HARD):
        pool, route, tier = ask(built, text)
        assert pool == idle
        assert route is (Route.CLOSE_CALL if tier != idle else None)


def test_with_both_pools_idle_a_close_call_keeps_its_tier_though_small_is_faster() -> None:
    built = fleet(margin=0.5, large_cost=SLOW)
    for text in (EASY, HARD):
        pool, route, tier = ask(built, text)
        assert (pool, route) == (tier, None)


def test_admin_route_explains_a_close_call_by_each_pools_prediction() -> None:
    built = fleet(margin=0.5, large_cost=SLOW)
    busy(built, "large")
    resolution = resolved(built, HARD)
    view = comparison_view(resolution.compared, resolution.compared_for)["close_call"]
    assert view is not None and list(view) == ["large", "small"]  # its tier's pool first
    large, small = view["large"], view["small"]
    assert large["idle_cold_ttft_s"] > small["idle_cold_ttft_s"]  # the slower model
    assert large["stretch"] > small["stretch"] * (1 + NEAR)  # why it moved
    assert resolution.pool.name == "small" and resolution.route is Route.CLOSE_CALL
    idle = resolved(fleet(margin=0.0), HARD)
    assert comparison_view(idle.compared, idle.compared_for) == {
        "close_call": None,
        "overflow": None,
    }


def test_a_close_call_stays_with_the_pool_that_holds_its_conversation() -> None:
    opening = {"role": "user", "content": HARD + " Notes: " + "the integrand decays fast. " * 150}
    answer = {"role": "assistant", "content": "Done."}
    follow_up = [opening, answer, {"role": "user", "content": "And the second derivation?"}]
    turn_two = orjson.dumps({"model": "auto", "messages": follow_up})
    cold = resolve(fleet(margin=0.5), parse_request(Endpoint.CHAT, turn_two), None)
    assert cold.verdict is not None and cold.verdict.tier.value == "large"
    assert (cold.pool.name, cold.route) == ("large", None)  # nothing held anywhere: its tier
    built = fleet(margin=0.5)
    small = built.pools["small"]  # where its first turn went (a close call sent small, say)
    first = parse_request(Endpoint.CHAT, orjson.dumps({"model": "s", "messages": [opening]}))
    seen = small.router.features(small.model, first.canonical_text, first.cache_salt)
    decision = small.decide(seen)
    assert decision is not None
    small.router.record(seen, decision, 0.0)
    warm = resolve(built, parse_request(Endpoint.CHAT, turn_two), None)
    assert (warm.pool.name, warm.route) == ("small", Route.CLOSE_CALL)


def test_a_conversation_gone_large_is_no_close_call_on_its_next_turns() -> None:
    """Its next turn, scored large but near the threshold, stays large: kept large, a turn
    scored small would have (a downgrade mid-task is what the memory is for)."""
    built = fleet(margin=0.5)  # every score a close call
    busy(built, "large")  # the small pool would answer sooner
    router = built.tiers["auto"]
    router.remember(conversation_key({"model": "auto", **dialogue(HARD)}) or 0)
    follow_up = orjson.dumps({"model": "auto", **dialogue(HARD, "And the other way?")})
    resolution = resolve(built, parse_request(Endpoint.CHAT, follow_up), None)
    verdict = resolution.verdict
    assert verdict is not None and verdict.tier.value == "large" and not verdict.kept
    assert (resolution.pool.name, resolution.route) == ("large", None)


def test_outside_the_margin_or_with_it_off_the_tier_decides() -> None:
    for margin in (0.0, 0.01):
        built = fleet(margin)
        busy(built, "small")
        assert ask(built, EASY)[:2] == ("small", None)
        busy(built, "large")
        assert ask(built, HARD)[:2] == ("large", None)
