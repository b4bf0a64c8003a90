"""Triage under overload: keep as many requests as possible within the TTFT objective.

When every replica is predicted to miss the objective, a request is late wherever it goes.
Spread evenly, late requests make every queue late, and then no request at all meets the
objective (goodput falls to zero while throughput holds). Sent instead to the replica already
furthest behind (below a limit, so none waits without end), they leave the other replicas'
queues short enough for the requests that can still be on time.
"""

from __future__ import annotations

from collections.abc import Sequence


def late_choice(
    predicted_s: Sequence[float],
    behind_s: Sequence[float],
    objective_s: float | None,
    limit_s: float,
) -> int | None:
    """Index of the replica for a request predicted late everywhere: the one furthest behind
    (``behind_s``: its wait, without this request's own prefill, so a late request does not
    also choose a cold prefill) among those predicted under ``limit_s``. None when no
    objective is set, when some replica can still serve it in time, when its own prefill
    alone, unqueued, misses it (late by its length, not by the queues: the rule would pile
    every long prompt onto one replica of an idle pool), or when every one is past the limit
    (then the fastest serves it)."""
    if objective_s is None or not predicted_s or min(predicted_s) <= objective_s:
        return None
    if min(p - b for p, b in zip(predicted_s, behind_s, strict=True)) > objective_s:
        return None
    within = [i for i, p in enumerate(predicted_s) if p <= limit_s]
    return max(within, key=behind_s.__getitem__) if within else None
