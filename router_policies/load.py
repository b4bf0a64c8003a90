"""Load rules shared by the policies: bounded load over recent dispatches, least-loaded picking."""

from __future__ import annotations

from collections.abc import Sequence

from router_policies.decision import Candidate
from router_policies.rendezvous import hrw_score


def recent_cap(recent: Sequence[float], eps: float) -> float:
    """Most recent dispatches a replica may have and still take one more request.

    Consistent hashing with bounded loads (Mirrokni et al.), applied to decayed dispatch counts
    rather than instantaneous in-flight counts, so a passing Poisson burst barely moves it while
    a persistently hot replica crosses it. Counts are smooth, so the bound needs no slack: a
    young pool's first requests are spread strictly, a busy pool's within (1 + eps).
    """
    mean_after = (sum(recent) + 1) / len(recent)
    return (1 + eps) * mean_after


def least_loaded(candidates: Sequence[Candidate], key: int) -> Candidate:
    """The candidate with the fewest queued requests; ties go to the best rendezvous rank for
    `key`, which spreads distinct prefixes and lets independent gateways break ties alike."""
    return min(candidates, key=lambda c: (c.queue, -hrw_score(key, c.name)))
