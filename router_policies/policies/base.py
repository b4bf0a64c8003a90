"""The one interface every selection policy implements."""

from __future__ import annotations

from typing import Protocol

from router_policies.decision import Decision, PoolSnapshot
from router_policies.fingerprint import RequestFeatures
from router_policies.schema import PoolPolicy


class SelectionPolicy(Protocol):
    uses_prefix: bool
    """Whether candidates need their prefix match computed (a cost the baselines skip)."""
    uses_fingerprint: bool
    """Whether the request's fingerprint is read at all (round-robin reads nothing)."""

    def select(
        self, features: RequestFeatures, snapshot: PoolSnapshot, policy: PoolPolicy
    ) -> Decision | None:
        """Choose a replica, or None when the snapshot has no candidate. No I/O, no mutation."""
        ...
