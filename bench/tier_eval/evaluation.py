"""The evaluation: the labelled set, the classifier's scores on it, and the operating points
and costs that follow."""

from __future__ import annotations

import json
import timeit
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.tier_eval.roc import roc_auc, roc_curve
from router_policies.calibration import QuantileThreshold
from router_policies.tier_classifiers import CueClassifier, TierClassifier
from router_policies.tier_settings import TierWeights

DEFAULT_DATA = Path(__file__).parent.parent / "data" / "tier_eval.jsonl"
DEFAULT_PLOT = Path("docs/tier_roc.png")
DEFAULT_WEIGHTS = TierWeights()
FIXED_THRESHOLD = 0.5
"""The policy file's default ``tiers.<name>.threshold``."""
LABELS = ("easy", "hard")
_TIMING_REPEATS = 5
_WORST_SHOWN = 5


@dataclass(frozen=True, slots=True)
class Example:
    id: str
    label: str
    """``easy`` or ``hard``."""
    category: str
    body: Mapping[str, Any]
    """An OpenAI chat/completions request body."""
    source: str = ""
    """Where the prompt comes from (public training sets); "" for the project's own set."""

    @property
    def hard(self) -> bool:
        return self.label == "hard"


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Routing at one threshold: scores at or above it go to the large pool."""

    threshold: float
    large_share: float
    """Share of the set routed large."""
    precision: float | None
    """Share of the large-routed prompts that are hard; None when nothing went large."""
    recall: float
    """Share of the hard prompts routed large."""
    easy_sent_large: int
    hard_sent_small: int


@dataclass(frozen=True, slots=True)
class CategoryRow:
    category: str
    n: int
    n_hard: int
    mean_score: float
    large_share: float
    """Share of the category routed large at the calibrated threshold."""
    misrouted: int
    """Easy prompts routed large plus hard prompts routed small, at the calibrated threshold."""


@dataclass(frozen=True, slots=True)
class TierEvalResult:
    path: str
    n: int
    n_hard: int
    target_large_share: float
    auc: float
    mean_score_easy: float
    mean_score_hard: float
    calibrated: OperatingPoint
    """At the threshold ``QuantileThreshold(target_large_share, window=n)`` converges to."""
    fixed: OperatingPoint
    """At the fixed threshold 0.5."""
    mean_decision_us: float
    """Mean time of one decision (score + compare), best of several passes over the set."""
    max_decision_us: float
    """Slowest single prompt, best of several runs each."""
    categories: tuple[CategoryRow, ...]
    worst_easy: tuple[tuple[str, float], ...]
    """Highest-scoring easy prompts (id, score): the most wasteful large-pool routings."""
    worst_hard: tuple[tuple[str, float], ...]
    """Lowest-scoring hard prompts (id, score): the ones most likely to be answered badly."""
    roc: tuple[tuple[float, float], ...]
    """ROC curve points (false positive rate, true positive rate), from (0, 0) to (1, 1)."""


def load_examples(path: str | Path = DEFAULT_DATA) -> list[Example]:
    """Reads the JSONL set; raises ValueError naming the line of a malformed record."""
    examples: list[Example] = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            label, body = record.get("label"), record.get("body")
            if label not in LABELS:
                raise ValueError(f"{path}:{lineno}: label must be one of {LABELS}, got {label!r}")
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError(f"{path}:{lineno}: body must be an object with a messages list")
            examples.append(
                Example(
                    id=str(record.get("id", f"line-{lineno}")),
                    label=label,
                    category=str(record.get("category", "uncategorised")),
                    body=body,
                    source=str(record.get("source", Path(path).stem)),
                )
            )
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def operating_point(
    scores: Sequence[float], positives: Sequence[bool], threshold: float
) -> OperatingPoint:
    large = [s >= threshold for s in scores]
    n_large = sum(large)
    true_large = sum(1 for g, p in zip(large, positives, strict=True) if g and p)
    n_pos = sum(positives)
    return OperatingPoint(
        threshold=threshold,
        large_share=n_large / len(scores),
        precision=true_large / n_large if n_large else None,
        recall=true_large / n_pos if n_pos else 0.0,
        easy_sent_large=n_large - true_large,
        hard_sent_small=n_pos - true_large,
    )


def calibrated_threshold(scores: Sequence[float], target_large_share: float) -> float:
    """The threshold ``QuantileThreshold`` holds after seeing ``scores`` in order, its window
    the whole sequence (so the order does not change the result)."""
    calibration = QuantileThreshold(
        target_share=target_large_share,
        window=len(scores),
        min_samples=len(scores),
        initial=FIXED_THRESHOLD,
    )
    for s in scores:
        calibration.observe(s)
    return calibration.threshold


def time_decisions(
    bodies: Sequence[Mapping[str, Any]], classifier: TierClassifier, threshold: float
) -> tuple[float, float]:
    """(mean, max) microseconds per decision: classify, then compare with the threshold.
    The mean is the best of several passes over the whole set; the max is the slowest prompt,
    each prompt timed as the best of several runs."""

    def decide_all() -> int:
        return sum(classifier.score(b).score >= threshold for b in bodies)

    def decide_one(body: Mapping[str, Any]) -> float:
        def decide() -> bool:
            return classifier.score(body).score >= threshold

        return min(timeit.repeat(decide, repeat=_TIMING_REPEATS, number=1))

    best_pass = min(timeit.repeat(decide_all, repeat=_TIMING_REPEATS, number=1))
    slowest = max(decide_one(body) for body in bodies)
    return best_pass / len(bodies) * 1e6, slowest * 1e6


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def evaluate(
    path: str | Path = DEFAULT_DATA,
    weights: TierWeights = DEFAULT_WEIGHTS,
    target_large_share: float = 0.4,
    classifier: TierClassifier | None = None,
) -> TierEvalResult:
    """``classifier`` defaults to the cue model with ``weights``."""
    if not 0.0 <= target_large_share <= 1.0:
        raise ValueError(f"target_large_share must be in [0, 1], got {target_large_share}")
    examples = load_examples(path)
    clf = classifier if classifier is not None else CueClassifier(weights)
    scores = [clf.score(e.body).score for e in examples]
    positives = [e.hard for e in examples]
    threshold = calibrated_threshold(scores, target_large_share)

    by_category: dict[str, list[int]] = defaultdict(list)
    for i, e in enumerate(examples):
        by_category[e.category].append(i)
    rows = []
    for category, idx in by_category.items():
        large = [scores[i] >= threshold for i in idx]
        rows.append(
            CategoryRow(
                category=category,
                n=len(idx),
                n_hard=sum(positives[i] for i in idx),
                mean_score=_mean([scores[i] for i in idx]),
                large_share=sum(large) / len(idx),
                misrouted=sum(g != positives[i] for g, i in zip(large, idx, strict=True)),
            )
        )
    rows.sort(key=lambda r: (r.n_hard / r.n, r.category))

    ranked = sorted(zip(scores, examples, strict=True), key=lambda se: se[0])
    worst_easy = [(e.id, s) for s, e in reversed(ranked) if not e.hard][:_WORST_SHOWN]
    worst_hard = [(e.id, s) for s, e in ranked if e.hard][:_WORST_SHOWN]
    mean_us, max_us = time_decisions([e.body for e in examples], clf, threshold)
    return TierEvalResult(
        path=str(path),
        n=len(examples),
        n_hard=sum(positives),
        target_large_share=target_large_share,
        auc=roc_auc(scores, positives),
        mean_score_easy=_mean([s for s, p in zip(scores, positives, strict=True) if not p]),
        mean_score_hard=_mean([s for s, p in zip(scores, positives, strict=True) if p]),
        calibrated=operating_point(scores, positives, threshold),
        fixed=operating_point(scores, positives, FIXED_THRESHOLD),
        mean_decision_us=mean_us,
        max_decision_us=max_us,
        categories=tuple(rows),
        worst_easy=tuple(worst_easy),
        worst_hard=tuple(worst_hard),
        roc=tuple(roc_curve(scores, positives)),
    )
