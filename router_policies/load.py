"""Load rules shared by the policies: the bounded-load cap and least-loaded picking."""

from __future__ import annotations

from collections.abc import Sequence

from router_policies.decision import Candidate
from router_policies.rendezvous import hrw_score


def load_cap(candidates: Sequence[Candidate], eps: float) -> float:
    """Highest load a replica may reach by taking one more request.

    Consistent hashing with bounded loads (Mirrokni et al.): after placing the request no
    replica exceeds (1 + eps) x the mean load; the + 1 keeps a nearly idle pool from
    refusing affinity to a second request.
    """
    mean_after = (sum(c.load for c in candidates) + 1) / len(candidates)
    return (1 + eps) * mean_after + 1


def under_cap(candidate: Candidate, cap: float) -> bool:
    return candidate.load + 1 <= cap


def least_loaded(candidates: Sequence[Candidate], key: int) -> Candidate:
    """The least-loaded candidate; ties go to the best rendezvous rank for `key`.

    Breaking ties by the request's prefix (rather than by position) spreads distinct prefixes,
    keeps a hot prefix's overflow on the same second replica (whose cache then holds it), and
    lets independent gateways break ties the same way.
    """
    return min(candidates, key=lambda c: (c.load, -hrw_score(key, c.name)))
