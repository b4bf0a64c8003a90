"""What a pool counts and learns from its requests: kept across policy reloads (PoolState
hands the same objects to each generation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.fleet.prediction_errors import PredictionErrors
from gateway.fleet.replicas import Dispatch
from gateway.relay.usage import PromptUsage

_CHARS_PER_TOKEN_WEIGHT = 0.05
"""Weight of each new usage report in a pool's learned characters per token (~last 20)."""


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

    def observe(self, dispatch: Dispatch, usage: PromptUsage) -> None:
        """The replica reported the prompt's size: learn characters per token, the request's
        true prefill work, and how far the prefix index's belief held."""
        if usage.prompt_tokens <= 0:
            return
        if dispatch.request.hashed_bytes > 0 and dispatch.request.plain:
            ratio = dispatch.request.hashed_bytes / usage.prompt_tokens
            self.chars_per_token += _CHARS_PER_TOKEN_WEIGHT * (ratio - self.chars_per_token)
        replica, cached = dispatch.replica, usage.cached_tokens
        if cached is None and replica.reports_cached:
            cached = 0
        if cached is not None:
            replica.reports_cached = True
            dispatch.uncached_tokens = max(usage.prompt_tokens - cached, 0)
            expected = usage.prompt_tokens - dispatch.decision.uncached_tokens
            if dispatch.exact_cached is not None and dispatch.estimated_cached is not None:
                # The decision read the events; the belief sizes the estimate, so judge that.
                expected = dispatch.estimated_cached
            replica.index_belief.observe(expected, cached)
            self.prediction_errors.observe(dispatch, cached)
