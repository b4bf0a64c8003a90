"""Baseline: the replica with the fewest requests, ignoring caches."""

from __future__ import annotations

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.load import least_loaded
from router_policies.schema import PoolPolicy


class LeastLoaded:
    uses_fingerprint = True
    uses_prefix = False

    def select(
        self, features: RequestFeatures, snapshot: PoolSnapshot, policy: PoolPolicy
    ) -> Decision | None:
        if not snapshot.candidates:
            return None
        best = least_loaded(snapshot.candidates, features.home_key)
        return Decision(best.name, Route.LEAST_LOADED)
