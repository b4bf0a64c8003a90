"""How far the router's belief of what a replica holds was from what the replica then reused:
per request, |predicted - reported| cached prompt tokens, by source (KV events, estimate)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.fleet.replicas import Dispatch

EVENTS = "events"
ESTIMATE = "estimate"


@dataclass(slots=True)
class PredictionErrors:
    sums: dict[str, float] = field(default_factory=lambda: {EVENTS: 0.0, ESTIMATE: 0.0})
    counts: dict[str, int] = field(default_factory=lambda: {EVENTS: 0, ESTIMATE: 0})

    def observe(self, dispatch: Dispatch, cached_tokens: int) -> None:
        for source, predicted in (
            (EVENTS, dispatch.exact_cached),
            (ESTIMATE, dispatch.estimated_cached),
        ):
            if predicted is not None:
                self.sums[source] += abs(predicted - cached_tokens)
                self.counts[source] += 1
