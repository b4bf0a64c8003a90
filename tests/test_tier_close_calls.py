"""Close calls: a tiered request scored within `close_call_margin` of the threshold goes to the
pool predicted to answer it first, each pool's policy routing it as it would now; outside the
margin, forced, kept large by its conversation or overflowing, the tier decides alone."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.fleet.pools import Fleet
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.resolve import resolve
from router_policies.decision import Route
from router_policies.schema import parse_policy
from router_policies.tier_settings import TierSettings
from router_policies.tiers import PoolChoice, PoolLoad, close_call_choice

EASY = "What is the capital of France?"
HARD = (
    "Prove step by step that the integral of $e^{-x^2}$ over the real line is $\\sqrt{\\pi}$, "
    "then compare two derivations and justify which is more rigorous."
)
IDLE = PoolLoad(healthy=1, queue_depth=0, saturation_queue_per_replica=8)
SETTINGS = TierSettings(small="small", large="large", close_call_margin=0.1)


def test_the_other_tier_takes_a_close_call_only_when_predicted_sooner_and_not_saturated() -> None:
    own = PoolChoice("small", overflow=False)
    moved = close_call_choice(own, SETTINGS, own_s=0.8, other_s=0.2, other=IDLE)
    assert moved == PoolChoice("large", overflow=False, close_call=True)
    assert close_call_choice(own, SETTINGS, 0.2, 0.2, IDLE) == own  # a tie stays home
    assert close_call_choice(own, SETTINGS, 0.2, 0.8, IDLE) == own
    assert close_call_choice(own, SETTINGS, None, 0.2, IDLE) == own  # no cost model: no guess
    full = PoolLoad(healthy=1, queue_depth=8, saturation_queue_per_replica=8)
    assert close_call_choice(own, SETTINGS, 0.8, 0.2, full) == own


def fleet(margin: float) -> Fleet:
    pool = {"max_inflight_per_replica": 64}
    policy = parse_policy(
        {
            "pools": {
                "small": {"model": "s", "replicas": ["http://10.0.0.1:8000"], **pool},
                "large": {"model": "l", "replicas": ["http://10.0.0.2:8000"], **pool},
            },
            "tiers": {"auto": {"small": "small", "large": "large", "close_call_margin": margin}},
        }
    )
    built = Fleet(policy)
    for _, replica in built.replicas():
        replica.record_probe(True, unhealthy_after=1, healthy_after=1)
    return built


def ask(built: Fleet, text: str, **headers: Any) -> tuple[str, Route | None, str]:
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    parsed = parse_request(Endpoint.CHAT, orjson.dumps(body))
    resolution = resolve(built, parsed, headers.get("tier"))
    assert resolution.verdict is not None
    return resolution.pool.name, resolution.route, resolution.verdict.tier.value


def busy(built: Fleet, pool: str) -> None:
    for replica in built.pools[pool].replicas.values():
        replica.inflight = 40


@pytest.mark.parametrize("loaded", ["small", "large"])
def test_with_every_request_a_close_call_the_idle_pool_answers(loaded: str) -> None:
    built = fleet(margin=0.5)  # every score is within 0.5 of the 0.5 threshold
    busy(built, loaded)
    idle = "large" if loaded == "small" else "small"
    for text in (EASY, HARD):
        pool, route, tier = ask(built, text)
        assert pool == idle
        assert route is (Route.CLOSE_CALL if tier != idle else None)


def test_outside_the_margin_or_with_it_off_the_tier_decides() -> None:
    for margin in (0.0, 0.01):
        built = fleet(margin)
        busy(built, "small")
        assert ask(built, EASY)[:2] == ("small", None)
        busy(built, "large")
        assert ask(built, HARD)[:2] == ("large", None)
