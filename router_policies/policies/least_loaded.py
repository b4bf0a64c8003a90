"""Baseline: the replica with the fewest requests, ignoring caches."""

from __future__ import annotations

from typing import ClassVar

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.load import least_loaded
from router_policies.policies.base import Need, SelectionPolicy
from router_policies.prefix_settings import PrefixSettings


class LeastLoaded(SelectionPolicy):
    needs: ClassVar[frozenset[Need]] = frozenset({Need.LOAD})

    def __init__(self, prefix: PrefixSettings) -> None:
        # Only for tie-breaks by the prompt's rendezvous order.
        self.prefix = prefix

    def select(
        self, request: RequestFeatures, snapshot: PoolSnapshot, *, explain: bool = False
    ) -> Decision | None:
        if not snapshot.candidates:
            return None
        best = least_loaded(snapshot.candidates, request.home_key)
        return Decision(best.name, Route.LEAST_LOADED)
