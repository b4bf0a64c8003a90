"""The tier-classifier evaluation (bench/tier_eval/) and the labelled set it runs on."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path

import pytest

from bench.tier_eval import (
    DEFAULT_DATA,
    FIXED_THRESHOLD,
    TierEvalResult,
    add_arguments,
    average_ranks,
    evaluate,
    format_report,
    load_examples,
    operating_point,
    roc_auc,
    roc_curve,
    run,
)
from bench.tier_eval.evaluation import Example
from bench.tier_eval.length import LengthAlone, length_class
from bench.tier_eval.roc import auc_standard_error, stratified_auc


@pytest.fixture(scope="module")
def shipped() -> TierEvalResult:
    return evaluate()


# --- the shipped set ----------------------------------------------------------------------------


def test_shipped_set_is_well_formed() -> None:
    examples = load_examples(DEFAULT_DATA)
    assert len(examples) >= 300
    assert len({e.id for e in examples}) == len(examples)
    labels = Counter(e.label for e in examples)
    assert 0.3 <= labels["hard"] / len(examples) <= 0.5
    for e in examples:
        assert e.body["messages"][-1]["role"] == "user"


def test_evaluation_runs_on_the_shipped_set(shipped: TierEvalResult) -> None:
    r = shipped
    assert r.n == len(load_examples())
    assert 0.0 <= r.auc <= 1.0
    # The calibrated threshold sends the target share large, up to ties at the threshold.
    assert r.calibrated.large_share == pytest.approx(0.4, abs=0.02)
    assert r.fixed.threshold == FIXED_THRESHOLD
    for point in (r.calibrated, r.fixed):
        assert point.precision is None or 0.0 <= point.precision <= 1.0
        assert 0.0 <= point.recall <= 1.0
    assert sum(row.n for row in r.categories) == r.n
    assert sum(row.n_hard for row in r.categories) == r.n_hard
    assert sum(row.misrouted for row in r.categories) == (
        r.calibrated.easy_sent_large + r.calibrated.hard_sent_small
    )
    assert 0.0 < r.mean_decision_us <= r.max_decision_us
    assert r.roc[0] == (0.0, 0.0)
    assert r.roc[-1] == (1.0, 1.0)
    report = format_report(r)
    assert "ROC AUC" in report
    assert all(row.category in report for row in r.categories)


def test_shipped_set_beats_chance(shipped: TierEvalResult) -> None:
    assert shipped.auc > 0.5


def test_shipped_set_auc_is_above_075(shipped: TierEvalResult) -> None:
    assert shipped.auc > 0.75


def test_target_share_moves_the_calibrated_threshold() -> None:
    low = evaluate(target_large_share=0.2)
    high = evaluate(target_large_share=0.6)
    assert low.calibrated.threshold > high.calibrated.threshold
    assert low.calibrated.large_share == pytest.approx(0.2, abs=0.02)
    assert high.calibrated.large_share == pytest.approx(0.6, abs=0.02)


# --- AUC on hand-made examples ------------------------------------------------------------------


def test_auc_perfect_separation_is_one() -> None:
    assert roc_auc([0.1, 0.2, 0.3, 0.8, 0.9], [False, False, False, True, True]) == 1.0


def test_auc_reversed_is_zero() -> None:
    assert roc_auc([0.9, 0.8, 0.3, 0.2], [False, False, True, True]) == 0.0


def test_auc_all_tied_is_one_half() -> None:
    assert roc_auc([0.5] * 6, [True, False, True, False, False, True]) == 0.5


def test_auc_counts_pairs_and_ties_half() -> None:
    # Positives 0.35 and 0.8 against negatives 0.1 and 0.4: 3 of 4 pairs ordered correctly.
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    # Positive 0.5 against negatives 0.5 (tie, counts half) and 0.2 (win): 1.5 / 2.
    assert roc_auc([0.5, 0.5, 0.2], [True, False, False]) == 0.75


def test_auc_agrees_with_counting_pairs() -> None:
    rng = random.Random(3)
    scores = [rng.choice([0.1, 0.2, 0.3, 0.4, 0.5]) for _ in range(60)]
    labels = [rng.random() < 0.4 for _ in range(60)]
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    assert roc_auc(scores, labels) == pytest.approx(wins / (len(pos) * len(neg)))


def test_auc_equals_area_under_the_roc_curve() -> None:
    rng = random.Random(5)
    scores = [round(rng.random(), 1) for _ in range(80)]
    labels = [rng.random() < s for s in scores]
    points = roc_curve(scores, labels)
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(points))
    assert roc_auc(scores, labels) == pytest.approx(area)


def test_the_aucs_standard_error_is_how_far_it_moves_between_samples() -> None:
    """Hanley and McNeil's formula against the AUCs of 400 samples of 30 hard and 60 easy
    scores drawn from one pair of distributions: their spread is the standard error."""
    rng = random.Random(11)
    aucs = []
    for _ in range(400):
        hard = [rng.gauss(1.3, 1.0) for _ in range(30)]
        easy = [rng.gauss(0.0, 1.0) for _ in range(60)]
        aucs.append(roc_auc(hard + easy, [True] * 30 + [False] * 60))
    mean = sum(aucs) / len(aucs)
    spread = math.sqrt(sum((a - mean) ** 2 for a in aucs) / (len(aucs) - 1))
    assert auc_standard_error(mean, 30, 60) == pytest.approx(spread, rel=0.2)
    assert auc_standard_error(mean, 300, 600) < auc_standard_error(mean, 30, 60) / 3
    assert auc_standard_error(1.0, 30, 60) == 0.0


def test_auc_needs_both_classes() -> None:
    with pytest.raises(ValueError):
        roc_auc([0.1, 0.2], [True, True])
    with pytest.raises(ValueError):
        roc_auc([0.1, 0.2], [False, False])


def test_stratified_auc_compares_only_pairs_within_a_stratum() -> None:
    # Within each stratum the hard prompt outscores both easy ones; across strata the short
    # hard one (0.2) is below the long easy ones, which the plain AUC counts and this does not.
    scores = [0.9, 0.8, 0.1, 0.2, 0.7, 0.05]
    labels = [True, False, False, True, False, False]
    strata = ["long", "long", "short", "short", "long", "short"]
    assert roc_auc(scores, labels) < 1.0
    assert stratified_auc(scores, labels, strata) == (1.0, 0.5)  # 4 of the 8 pairs compared
    losing_short = [0.9, 0.8, 0.3, 0.2, 0.7, 0.25]
    assert stratified_auc(losing_short, labels, strata)[0] == pytest.approx(0.5)


def test_stratified_auc_is_nan_when_no_stratum_holds_both_classes() -> None:
    auc, share = stratified_auc([0.1, 0.9], [False, True], ["short", "long"])
    assert math.isnan(auc) and share == 0.0


def test_the_length_yardstick_reads_the_tasks_first_user_message() -> None:
    def chat(*turns: str) -> dict[str, object]:
        return {"messages": [{"role": "user", "content": t} for t in turns]}

    short, long_ = chat("x" * 40), chat("x" * 400)
    assert LengthAlone().score(long_).score > LengthAlone().score(short).score
    # A follow-up does not change the task's length, nor its class.
    assert LengthAlone().score(chat("x" * 40, "y" * 900)).score == LengthAlone().score(short).score

    def example(text: str) -> Example:
        return Example("e", "easy", "c", chat(text))

    assert length_class(example("x" * 40)) == length_class(example("x" * 60))
    assert length_class(example("x" * 40)) != length_class(example("x" * 80))


def test_average_ranks_share_ties() -> None:
    assert average_ranks([0.3, 0.1, 0.3, 0.2]) == [3.5, 1.0, 3.5, 2.0]


def test_operating_point_counts() -> None:
    point = operating_point([0.1, 0.6, 0.7, 0.4], [False, True, False, True], threshold=0.5)
    assert point.large_share == 0.5
    assert point.precision == 0.5
    assert point.recall == 0.5
    assert (point.easy_sent_large, point.hard_sent_small) == (1, 1)
    nothing = operating_point([0.1, 0.2], [True, False], threshold=0.9)
    assert nothing.precision is None
    assert nothing.recall == 0.0


# --- loading and the command line ---------------------------------------------------------------


def test_load_rejects_an_unknown_label_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    good = {"id": "a", "label": "easy", "category": "c", "body": {"messages": []}}
    bad = {**good, "id": "b", "label": "medium"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"set\.jsonl:2: label"):
        load_examples(path)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_run_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("--no-plot", "--target-share", "0.3")) == 0
    out = capsys.readouterr().out
    assert "ROC AUC" in out
    assert "calibrated (target 30%)" in out


def test_run_writes_the_roc_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sub" / "roc.png"
    assert run(_args("--plot", str(plot))) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args("--no-plot", "--data", str(tmp_path / "nope.jsonl"))) == 2
    assert "cannot read" in capsys.readouterr().err


def test_target_share_outside_zero_one_is_rejected() -> None:
    with pytest.raises(SystemExit):
        _args("--target-share", "1.5")
