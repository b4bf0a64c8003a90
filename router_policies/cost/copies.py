"""The fleet's cost of a cold copy: prefill work beyond what the warmest replica would do.

A request's own TTFT is not all a choice costs. Sent to a replica that lacks a prefix another
replica holds, it prefills that prefix again: seconds of that engine's time that every request
queued behind it waits too, and cache room that evicts some other prefix, whose next request
then prefills cold in turn. Predicted TTFT alone trades a copy for a few milliseconds; this
term charges the extra prefill once more, weighted, so a copy is made only when the warm
replicas are behind by more than the copy costs.
"""

from __future__ import annotations


def copy_penalty_s(
    uncached_tokens: float, warmest_tokens: float, prefill_s_per_token: float, weight: float
) -> float:
    """Seconds added to a replica's score for the prefill it would do beyond the warmest's."""
    return weight * max(uncached_tokens - warmest_tokens, 0.0) * prefill_s_per_token
