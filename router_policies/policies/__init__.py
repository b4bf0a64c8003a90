"""Replica selection policies, one per module behind one narrow interface, plus their registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from router_policies.policies.base import Need, SelectionPolicy
from router_policies.policies.least_loaded import LeastLoaded
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.policies.round_robin import RoundRobin
from router_policies.schema import PolicyName, PoolPolicy

Factory = Callable[[PoolPolicy, SelectionPolicy | None], SelectionPolicy]


def _prefix_aware(policy: PoolPolicy, previous: SelectionPolicy | None) -> SelectionPolicy:
    # Only a prefix policy's index and hot-prefix counts are worth carrying over a reload.
    return PrefixAware(policy, previous if isinstance(previous, PrefixAware) else None)


REGISTRY: Mapping[PolicyName, Factory] = {
    PolicyName.PREFIX_AWARE: _prefix_aware,
    PolicyName.LEAST_LOADED: lambda policy, previous: LeastLoaded(policy.prefix),
    PolicyName.ROUND_ROBIN: lambda policy, previous: RoundRobin(),
}


def make_policy(policy: PoolPolicy, previous: SelectionPolicy | None = None) -> SelectionPolicy:
    """The pool's policy object, carrying over what ``previous`` learned where it still holds."""
    return REGISTRY[policy.policy](policy, previous)


__all__ = ["REGISTRY", "Need", "SelectionPolicy", "make_policy"]
