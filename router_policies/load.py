"""Least-loaded picking, shared by the policies."""

from __future__ import annotations

from collections.abc import Sequence

from router_policies.decision import Candidate
from router_policies.rendezvous import hrw_score


def least_loaded(candidates: Sequence[Candidate], key: int) -> Candidate:
    """The candidate with the fewest queued requests; ties go to the best rendezvous rank for
    `key`, which spreads distinct prefixes and lets independent gateways break ties alike."""
    return min(candidates, key=lambda c: (c.queue, -hrw_score(key, c.name)))
