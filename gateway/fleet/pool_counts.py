"""What a pool counts and learns from its requests: kept across policy reloads (PoolState
hands the same objects to each generation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.fleet.prediction_errors import PredictionErrors


@dataclass(slots=True)
class RemoteCounts:
    """The other gateway instances' counts for a pool (shared state; all 0 when none)."""

    arrivals: int = 0
    """Their arrivals since this instance started (only grows)."""
    completions: int = 0
    waiting: int = 0
    """Requests waiting inside them for a replica of this pool, now."""


@dataclass(slots=True)
class PoolCounts:
    """The pool's requests counted since the process started; a reload keeps counting."""

    dispatched: int = 0
    """Dispatches, retries not counted: round-robin's cursor."""
    arrivals: int = 0
    """Requests routed to this pool, counted on arrival: demand, not throughput."""
    completions: int = 0
    """Requests (attempts) that ended: with saturation, they teach the capacity."""
    remote: RemoteCounts = field(default_factory=RemoteCounts)


@dataclass(slots=True)
class UsageLearning:
    """What the replicas' `usage` reports taught the pool; a reload keeps it."""

    chars_per_token: float
    """Bytes of canonical prompt per model token."""
    prediction_errors: PredictionErrors = field(default_factory=PredictionErrors)
