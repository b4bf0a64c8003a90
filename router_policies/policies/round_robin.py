"""Baseline: replicas in turn, ignoring caches and load."""

from __future__ import annotations

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.policies.base import SelectionPolicy


class RoundRobin(SelectionPolicy):
    def select(
        self, request: RequestFeatures, snapshot: PoolSnapshot, *, explain: bool = False
    ) -> Decision | None:
        if not snapshot.candidates:
            return None
        chosen = snapshot.candidates[snapshot.dispatched % len(snapshot.candidates)]
        return Decision(chosen.name, Route.ROUND_ROBIN)
