"""Prefix-aware routing with bounded load.

1. prefix-hit: among replicas under the load cap, the one holding the longest useful match.
2. prefix-home: no useful match under the cap, but a shared lead (system prompt, tools) that is
   a useful share of the prompt: the lead's rendezvous home, if under the cap, so the first
   requests of a new system prompt meet on one replica and every gateway agrees which.
3. least-loaded: otherwise. A prompt that is mostly its own unique text gains little from any
   cache, so it goes by load (Preble's rule), and a busy home never piles work onto one replica.
"""

from __future__ import annotations

from router_policies.decision import Candidate, Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.load import least_loaded, load_cap, under_cap
from router_policies.rendezvous import hrw_score
from router_policies.schema import PoolPolicy, PrefixSettings


def _useful(matched_blocks: int, features: RequestFeatures, prefix: PrefixSettings) -> bool:
    if matched_blocks < prefix.min_match_blocks:
        return False
    matched_bytes = min(matched_blocks * prefix.block_bytes, features.hashed_bytes)
    return matched_bytes >= prefix.min_match_ratio * features.hashed_bytes


def _lead_worth_a_home(features: RequestFeatures, prefix: PrefixSettings) -> bool:
    full_blocks = features.lead_bytes // prefix.block_bytes
    return _useful(full_blocks, features, prefix)


class PrefixAware:
    uses_fingerprint = True
    uses_prefix = True

    def select(
        self, features: RequestFeatures, snapshot: PoolSnapshot, policy: PoolPolicy
    ) -> Decision | None:
        candidates = snapshot.candidates
        if not candidates:
            return None
        cap = load_cap(candidates, policy.load.balance_eps)
        # Never empty: the least-loaded replica is always under the cap.
        eligible = [c for c in candidates if under_cap(c, cap)]
        key = features.home_key
        best = max(eligible, key=lambda c: _rank(c, key))
        if _useful(best.matched_blocks, features, policy.prefix):
            return Decision(best.name, Route.PREFIX_HIT, best.matched_blocks)
        if _lead_worth_a_home(features, policy.prefix):
            home = max(candidates, key=lambda c: hrw_score(key, c.name))
            if under_cap(home, cap):
                return Decision(home.name, Route.PREFIX_HOME, home.matched_blocks)
        fallback = least_loaded(candidates, key)
        return Decision(fallback.name, Route.LEAST_LOADED, fallback.matched_blocks)


def _rank(c: Candidate, key: int) -> tuple[int, float, int]:
    # Longest match first; among equal matches the less loaded, then the rendezvous order.
    return (c.matched_blocks, -c.load, hrw_score(key, c.name))
