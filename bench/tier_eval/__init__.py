"""How well the easy/hard tier classifier separates a labelled prompt set, and what it costs.

``llm-gateway bench tiers`` scores every prompt of ``bench/data/tier_eval.jsonl``
(README.md there says where the prompts come from and how they were labelled) with
``router_policies.tier_classifier.score`` and reports:

- ROC AUC of the score against the label: the chance that a random hard prompt outscores a
  random easy one (rank-sum formula, ties counted half). Independent of any threshold.
- Two operating points, each with the share routed to the large pool and the precision and
  recall of "hard": the threshold ``QuantileThreshold`` converges to when fed the set's scores
  in order (window = the whole set) for a target large-pool share, and the fixed default 0.5.
- Time per decision (score plus threshold comparison), timed over the whole set.
- A per-category table: where the misrouted prompts are.

The set is small and author-labelled: read the numbers as a sanity check, not a benchmark.
"""

# Modules: ``evaluation`` (the set and the figures), ``roc``, ``report``, ``cli``; for the
# learned classifier: ``train`` (numpy logistic regression), ``tiers_cli`` (``llm-gateway tiers
# train|eval``), ``build_data`` (the public training sets under bench/data/tier_train/).

from __future__ import annotations

from bench.tier_eval.cli import add_arguments, run
from bench.tier_eval.evaluation import (
    DEFAULT_DATA,
    FIXED_THRESHOLD,
    CategoryRow,
    Example,
    OperatingPoint,
    TierEvalResult,
    calibrated_threshold,
    evaluate,
    load_examples,
    operating_point,
)
from bench.tier_eval.report import format_report, write_roc_plot
from bench.tier_eval.roc import average_ranks, roc_auc, roc_curve

__all__ = [
    "DEFAULT_DATA",
    "FIXED_THRESHOLD",
    "CategoryRow",
    "Example",
    "OperatingPoint",
    "TierEvalResult",
    "add_arguments",
    "average_ranks",
    "calibrated_threshold",
    "evaluate",
    "format_report",
    "load_examples",
    "operating_point",
    "roc_auc",
    "roc_curve",
    "run",
    "write_roc_plot",
]
