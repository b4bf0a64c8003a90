"""From the model a client names to a pool: a pool's own model, or a tier classified into one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import orjson

from gateway import headers
from gateway.errors import model_not_found
from gateway.request_body import ParsedRequest
from gateway.state import Fleet, PoolState
from router_policies.decision import Route
from router_policies.fingerprint import RequestFeatures
from router_policies.tier_router import TierRouter, TierVerdict
from router_policies.tiers import PoolChoice, choose_pool


@dataclass(frozen=True, slots=True)
class Resolution:
    parsed: ParsedRequest
    """As forwarded: a tiered request's `model` is rewritten to the chosen pool's model."""
    pool: PoolState
    features: RequestFeatures
    verdict: TierVerdict | None = None
    choice: PoolChoice | None = None
    tier_router: TierRouter | None = None

    @property
    def route(self) -> Route | None:
        return Route.OVERFLOW if self.choice is not None and self.choice.overflow else None

    def response_headers(self) -> dict[str, str]:
        if self.verdict is None:
            return {}
        return {
            headers.TIER: self.verdict.tier.value,
            headers.TIER_SCORE: f"{self.verdict.score.score:.3f}",
        }


def resolve(fleet: Fleet, parsed: ParsedRequest, forced_tier: str | None) -> Resolution:
    pool = fleet.pool_for_model(parsed.model)
    verdict = choice = tier_router = None
    if pool is None:
        tier_router = fleet.tiers.get(parsed.model)
        if tier_router is None:
            raise model_not_found(parsed.model)
        verdict = tier_router.classify(parsed.body, forced_tier)
        settings = tier_router.settings
        small, large = fleet.pools[settings.small], fleet.pools[settings.large]
        choice = choose_pool(verdict.tier, settings, small.load(), large.load())
        pool = fleet.pools[choice.pool]
        body = {**parsed.body, "model": pool.model}
        parsed = dataclasses.replace(parsed, body=body, raw=orjson.dumps(body), model=pool.model)
    features = pool.router.features(parsed.model, parsed.canonical_text, parsed.cache_salt)
    return Resolution(parsed, pool, features, verdict, choice, tier_router)
