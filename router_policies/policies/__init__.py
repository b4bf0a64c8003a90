"""Replica selection policies, one per module behind one narrow interface, plus their registry."""

from __future__ import annotations

from collections.abc import Mapping

from router_policies.policies.base import SelectionPolicy
from router_policies.policies.least_loaded import LeastLoaded
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.policies.round_robin import RoundRobin
from router_policies.schema import PolicyName

REGISTRY: Mapping[PolicyName, SelectionPolicy] = {
    PolicyName.PREFIX_AWARE: PrefixAware(),
    PolicyName.LEAST_LOADED: LeastLoaded(),
    PolicyName.ROUND_ROBIN: RoundRobin(),
}

__all__ = ["REGISTRY", "SelectionPolicy"]
