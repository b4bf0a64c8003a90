"""A routing decision as operators read it (POST /admin/route): each candidate's predicted
time to first token and its parts, in seconds and tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router_policies.cost.ttft import TtftEstimate
from router_policies.decision import CandidateCost, Decision, Route
from router_policies.tiers import PoolPrediction


def _estimate(estimate: TtftEstimate) -> dict[str, float]:
    return {
        "predicted_ttft_s": round(estimate.total_s, 6),
        "slot_s": round(estimate.slot_s, 6),
        "wait_s": round(estimate.wait_s, 6),
        "prefill_s": round(estimate.prefill_s, 6),
        "step_s": round(estimate.step_s, 6),
    }


def _candidate(cost: CandidateCost) -> dict[str, Any]:
    return {
        "replica": cost.name,
        "matched_blocks": cost.matched_blocks,
        "uncached_tokens": round(cost.uncached_tokens, 1),
        "recent_requests": round(cost.recent, 2),
        **_estimate(cost.estimate),
        "prefill_tokens_per_s": round(cost.rates.prefill_tokens_per_s, 1),
        "rate_step_s": round(cost.rates.step_s, 6),
        "rate_decode_s_per_seq": round(cost.rates.decode_s_per_seq, 7),
    }


def explain(decision: Decision | None) -> dict[str, Any]:
    if decision is None:
        return {"predicted": None, "candidates": []}
    costs = sorted(decision.costs, key=lambda c: c.estimate.total_s)
    return {
        "predicted": _estimate(decision.estimate) if decision.estimate else None,
        "candidates": [_candidate(c) for c in costs],
    }


def comparison_view(
    compared: Sequence[tuple[str, PoolPrediction | None]], compared_for: Route | None
) -> dict[str, Any]:
    """``close_call`` and ``overflow``: the predictions by pool, the tier's pool first, that a
    close call or an easy request's predicted climb read; null for the rule that read none. A
    close call moves when the other pool's stretch is lower beyond the cost model's near band;
    a climb when the large pool's predicted TTFT is."""
    view = None
    if compared:
        view = {
            pool: None
            if p is None
            else {
                "predicted_ttft_s": round(p.ttft_s, 6),
                "idle_cold_ttft_s": round(p.idle_cold_s, 6),
                "stretch": round(p.stretch, 4),
            }
            for pool, p in compared
        }
    return {
        "close_call": view if compared_for is Route.CLOSE_CALL else None,
        "overflow": view if compared_for is Route.OVERFLOW else None,
    }
