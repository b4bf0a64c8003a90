"""The input and output of a routing decision: plain values, so decisions are pure and testable."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Route(StrEnum):
    """Why a replica was chosen; sent to clients as x-gateway-route (CONTRACT)."""

    PREFIX_HIT = "prefix-hit"
    PREFIX_HOME = "prefix-home"
    LEAST_LOADED = "least-loaded"
    ROUND_ROBIN = "round-robin"
    OVERFLOW = "overflow"
    """A tiered request sent to the other pool because its own was saturated."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A healthy replica as the router sees it at dispatch time."""

    name: str
    load: float
    """Requests this gateway has in flight there, plus the replica's scraped waiting queue."""
    matched_blocks: int = 0
    """Leading fingerprint blocks of this request the replica is believed to hold."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    candidates: tuple[Candidate, ...]
    """Healthy replicas not yet tried for this request, in the pool's configured order."""
    dispatched: int = 0
    """Requests the pool has dispatched so far: round-robin's cursor."""


@dataclass(frozen=True, slots=True)
class Decision:
    replica: str
    route: Route
    matched_blocks: int = 0
