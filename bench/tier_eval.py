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

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router_policies.calibration import QuantileThreshold
from router_policies.schema import TierWeights
from router_policies.tier_classifier import score

DEFAULT_DATA = Path(__file__).parent / "data" / "tier_eval.jsonl"
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
                )
            )
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for i in order[start : end + 1]:
            ranks[i] = mean_rank
        start = end + 1
    return ranks


def roc_auc(scores: Sequence[float], positives: Sequence[bool]) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney U) formula:
    (sum of positive ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg), ties averaged, so a
    positive tied with a negative counts half. Raises ValueError without both classes."""
    if len(scores) != len(positives):
        raise ValueError("scores and labels differ in length")
    n_pos = sum(positives)
    n_neg = len(positives) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs at least one positive and one negative example")
    ranks = average_ranks(scores)
    rank_sum = sum(r for r, p in zip(ranks, positives, strict=True) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def roc_curve(scores: Sequence[float], positives: Sequence[bool]) -> list[tuple[float, float]]:
    """(false positive rate, true positive rate) at every distinct threshold, highest first;
    tied scores move the curve in one diagonal step."""
    n_pos = sum(positives)
    n_neg = len(positives) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("a ROC curve needs at least one positive and one negative example")
    pairs = sorted(zip(scores, positives, strict=True), key=lambda sp: -sp[0])
    points = [(0.0, 0.0)]
    tp = fp = 0
    for i, (s, positive) in enumerate(pairs):
        tp += positive
        fp += not positive
        if i + 1 == len(pairs) or pairs[i + 1][0] != s:
            points.append((fp / n_neg, tp / n_pos))
    return points


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
    bodies: Sequence[Mapping[str, Any]], weights: TierWeights, threshold: float
) -> tuple[float, float]:
    """(mean, max) microseconds per decision: classify, then compare with the threshold.
    The mean is the best of several passes over the whole set; the max is the slowest prompt,
    each prompt timed as the best of several runs."""

    def decide_all() -> int:
        return sum(score(b, weights).score >= threshold for b in bodies)

    def decide_one(body: Mapping[str, Any]) -> float:
        def decide() -> bool:
            return score(body, weights).score >= threshold

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
) -> TierEvalResult:
    if not 0.0 <= target_large_share <= 1.0:
        raise ValueError(f"target_large_share must be in [0, 1], got {target_large_share}")
    examples = load_examples(path)
    scores = [score(e.body, weights).score for e in examples]
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
    mean_us, max_us = time_decisions([e.body for e in examples], weights, threshold)
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


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def _point_line(name: str, p: OperatingPoint) -> str:
    return (
        f"  {name:<28} {p.threshold:9.4f} {_pct(p.large_share):>8} {_pct(p.precision):>9}"
        f" {_pct(p.recall):>8} {p.easy_sent_large:>10} {p.hard_sent_small:>10}"
    )


def _display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def format_report(result: TierEvalResult) -> str:
    r = result
    lines = [
        f"tier classifier on {_display_path(r.path)}",
        f"  {r.n} prompts: {r.n - r.n_hard} easy, {r.n_hard} hard ({_pct(r.n_hard / r.n).strip()})",
        f"  ROC AUC {r.auc:.3f}   mean score: easy {r.mean_score_easy:.3f}, "
        f"hard {r.mean_score_hard:.3f}",
        "",
        f"  {'operating point':<28} {'threshold':>9} {'large':>8} {'precision':>9}"
        f" {'recall':>8} {'easy->large':>10} {'hard->small':>10}",
        _point_line(f"calibrated (target {r.target_large_share:.0%})", r.calibrated),
        _point_line(f"fixed {FIXED_THRESHOLD}", r.fixed),
        "  (precision and recall of 'hard'; large = share of the set routed to the large pool)",
        "",
        f"  decision time: mean {r.mean_decision_us:.1f} us, slowest prompt "
        f"{r.max_decision_us:.1f} us",
        "",
        f"  per category, routed at the calibrated threshold {r.calibrated.threshold:.4f}:",
        f"  {'category':<20} {'n':>4} {'hard':>5} {'mean score':>11} {'large':>8}"
        f" {'misrouted':>10}",
    ]
    for row in r.categories:
        lines.append(
            f"  {row.category:<20} {row.n:>4} {row.n_hard:>5} {row.mean_score:>11.3f}"
            f" {_pct(row.large_share):>8} {row.misrouted:>10}"
        )
    lines += ["", "  highest-scoring easy prompts:"]
    lines += [f"    {s:.3f}  {i}" for i, s in r.worst_easy]
    lines += ["  lowest-scoring hard prompts:"]
    lines += [f"    {s:.3f}  {i}" for i, s in r.worst_hard]
    return "\n".join(lines) + "\n"


def write_roc_plot(result: TierEvalResult, path: str | Path) -> None:
    """The ROC curve with both operating points marked, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=120)
    fpr = [p[0] for p in result.roc]
    tpr = [p[1] for p in result.roc]
    ax.plot(fpr, tpr, drawstyle="default", label=f"classifier (AUC {result.auc:.3f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8, label="chance")
    n_easy = result.n - result.n_hard
    for name, point, marker in (
        (f"calibrated, {result.target_large_share:.0%} large", result.calibrated, "o"),
        (f"fixed {FIXED_THRESHOLD}", result.fixed, "s"),
    ):
        ax.plot(
            point.easy_sent_large / n_easy,
            point.recall,
            marker=marker,
            linestyle="none",
            label=f"{name} (t={point.threshold:.3f})",
        )
    ax.set_xlabel("false positive rate (easy routed large)")
    ax.set_ylabel("true positive rate (hard routed large)")
    ax.set_title(f"Tier classifier ROC, {result.n} labelled prompts")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-share",
        type=_share,
        default=0.4,
        help="target share of traffic for the large pool, for the calibrated threshold "
        "(default 0.4)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="labelled JSONL set (default: the shipped bench/data/tier_eval.jsonl)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=DEFAULT_PLOT,
        help=f"write the ROC curve as a PNG here (default {DEFAULT_PLOT}; needs matplotlib)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the ROC plot")


def run(args: argparse.Namespace) -> int:
    try:
        result = evaluate(args.data, target_large_share=args.target_share)
    except OSError as exc:
        print(f"error: cannot read {args.data}: {exc.strerror}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(format_report(result))
    if not args.no_plot:
        try:
            write_roc_plot(result, args.plot)
        except ImportError:
            print("note: matplotlib is not installed; no plot written", file=sys.stderr)
        else:
            print(f"  ROC plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
