"""Baseline: replicas in turn, ignoring caches and load."""

from __future__ import annotations

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.schema import PoolPolicy


class RoundRobin:
    uses_fingerprint = False
    uses_prefix = False

    def select(
        self, features: RequestFeatures, snapshot: PoolSnapshot, policy: PoolPolicy
    ) -> Decision | None:
        if not snapshot.candidates:
            return None
        chosen = snapshot.candidates[snapshot.dispatched % len(snapshot.candidates)]
        return Decision(chosen.name, Route.ROUND_ROBIN)
