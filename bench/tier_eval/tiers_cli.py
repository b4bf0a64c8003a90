"""``llm-gateway tiers``: train the learned tier classifier and evaluate it against the cue model.

    llm-gateway tiers train DATA.jsonl [DATA.jsonl ...] --out model.json.gz
    llm-gateway tiers eval [--model model.json.gz] [--no-timing]

``train`` reads labelled prompts in the format of bench/data/tier_eval.jsonl (``label``,
``body``, optional ``category`` and ``source``) and writes a model file that a policy names in
``tiers.<name>.model`` (with ``classifier: learned``). The shipped default model is
``tiers train bench/data/tier_train/*.jsonl --out router_policies/models/tier_default.json.gz``.

``eval`` prints, as Markdown (docs/tier-eval.md holds the latest output):
- cross-source held-out splits (``SPLITS``): trained on one group of public sources, tested on
  another it never saw, with the cue model's figures on the same test prompts beside;
- both classifiers on the public held-out sets (bench/data/tier_heldout/, built by
  bench/tier_eval/build_heldout.py): reasoning and planning in words, and conversations, kinds
  of request the training sets lack, never trained on;
- both classifiers on the project's own set (bench/data/tier_eval.jsonl), never trained on;
- on every test set, the task's length alone as a yardstick, and each classifier's AUC over the
  hard-easy pairs of one length class: what it ranks beyond how long the prompts are;
- decision time (p50, p90) on 2 KB and 30 KB prompts, model load time and resident memory.

A tooling plugin, not a product command: training needs numpy (the bench extra); serving the
model it writes needs only the base install.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.tier_eval.build_heldout import DIALOGUES, REASONING
from bench.tier_eval.conversations import EVAL_FOLLOW_UPS, conversations
from bench.tier_eval.evaluation import DEFAULT_DATA, Example, calibrated_threshold, load_examples
from bench.tier_eval.length import LengthAlone, length_class
from bench.tier_eval.roc import auc_standard_error, roc_auc, stratified_auc
from bench.tier_eval.timing import timing_report
from bench.tier_eval.train import TrainConfig, train
from gateway.cli_types import non_negative_float, positive_int, share
from router_policies.tier_classifiers import CueClassifier, TierClassifier, load_learned
from router_policies.tier_settings import TierWeights

TRAIN_DATA = Path(__file__).parent.parent / "data" / "tier_train"
HELDOUT_DATA = Path(__file__).parent.parent / "data" / "tier_heldout"
_PART_A = (
    "gsm8k",
    "humaneval",
    "theoremqa",
    "selfinstruct_seed",
    "p3_a",
    "nq_open",
    "banking77",
    "acpbench",
    "proofwriter",
    "math_drills_a",
)
_PART_B = (
    "math",
    "mbpp",
    "p3_b",
    "clinc",
    "prontoqa",
    "multilogieval",
    "conala",
    "math_drills_b",
)
SPLITS = (("A -> B", _PART_A, _PART_B), ("B -> A", _PART_B, _PART_A))  # fmt: skip
"""(name, training sources, held-out test sources): no source is on both sides."""
TARGET_SHARE = 0.3
HARD_SHARE_FOR_RECALL = 0.25
"""Recall at the 30% threshold is measured on the held-out prompts resampled to this share of
hard ones: with more hard prompts than the target share, recall is capped at share / hard."""
SEED = 9


@dataclass(frozen=True, slots=True)
class Figures:
    n: int
    n_hard: int
    auc: float
    auc_se: float
    """The AUC's standard error (``auc_standard_error``)."""
    threshold: float
    recall: float
    """Recall of hard at ``threshold``: by default the one that sends TARGET_SHARE of the
    prompts large."""
    large_precision: float
    large_share: float
    auc_within_length: float
    """AUC over the hard-easy pairs whose tasks are of one length class (``length_class``)."""
    length_pairs: float
    """The share of all hard-easy pairs that are of one length class."""

    def auc_cells(self) -> str:
        """The AUC and its standard error, as two table cells."""
        return f"{self.auc:.3f} | {self.auc_se:.3f}"

    def within_length(self) -> str:
        if math.isnan(self.auc_within_length):
            return "n/a"
        return f"{self.auc_within_length:.3f} ({self.length_pairs:.0%})"


def classifiers(model: TierClassifier) -> tuple[tuple[str, TierClassifier], ...]:
    """What each report table compares: the learned model, the cue model, and length alone."""
    return (
        ("learned", model),
        ("cue", CueClassifier(TierWeights())),
        ("length alone", LengthAlone()),
    )


def figures(
    classifier: TierClassifier, examples: Sequence[Example], threshold: float | None = None
) -> Figures:
    scores = [classifier.score(e.body).score for e in examples]
    positives = [e.hard for e in examples]
    if threshold is None:
        threshold = calibrated_threshold(scores, TARGET_SHARE)
    large = [s > threshold for s in scores]
    true_large = sum(g and p for g, p in zip(large, positives, strict=True))
    within, pairs = stratified_auc(scores, positives, [length_class(e) for e in examples])
    auc, n_hard = roc_auc(scores, positives), sum(positives)
    return Figures(
        n=len(examples),
        n_hard=n_hard,
        auc=auc,
        auc_se=auc_standard_error(auc, n_hard, len(positives) - n_hard),
        auc_within_length=within,
        length_pairs=pairs,
        threshold=threshold,
        recall=true_large / max(1, sum(positives)),
        large_precision=true_large / max(1, sum(large)),
        large_share=sum(large) / max(1, len(large)),
    )


def load_sources(names: Sequence[str], folder: Path = TRAIN_DATA) -> list[Example]:
    out: list[Example] = []
    for name in names:
        out += load_examples(folder / f"{name}.jsonl")
    return out


def recall_mix(examples: Sequence[Example]) -> list[Example]:
    """All the easy prompts and a seeded sample of hard ones, HARD_SHARE_FOR_RECALL of the mix."""
    easy = [e for e in examples if not e.hard]
    hard = [e for e in examples if e.hard]
    want = round(len(easy) * HARD_SHARE_FOR_RECALL / (1 - HARD_SHARE_FOR_RECALL))
    return easy + random.Random(SEED).sample(hard, min(want, len(hard)))


# --- the report -----------------------------------------------------------------------------


def split_report(folder: Path, config: TrainConfig) -> list[str]:
    lines = [
        "### Cross-source held-out splits",
        "",
        f"Recall of hard at the threshold sending {TARGET_SHARE:.0%} of prompts large, on the "
        f"held-out prompts resampled to {HARD_SHARE_FOR_RECALL:.0%} hard (all easy ones kept).",
        "",
        "| split | test set | classifier | n | hard | ROC AUC | SE | recall@30% "
        "| AUC within length |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, train_sources, test_sources in SPLITS:
        model = train(load_sources(train_sources, folder), config)
        test = load_sources(test_sources, folder)
        easy = [e for e in test if not e.hard]
        sets = [("all held-out: " + " + ".join(test_sources), test)]
        followed = conversations(test, EVAL_FOLLOW_UPS, 1.0, config.seed)
        sets.append(("all held-out, each + a follow-up (two turns)", followed))
        for source in test_sources:
            hard = [e for e in test if e.hard and e.source == source]
            if hard:
                sets.append((f"{source} (hard) + held-out easy", hard + easy))
        for set_name, examples in sets:
            for clf_name, clf in classifiers(model):
                f = figures(clf, examples)
                mix = figures(clf, recall_mix(examples))
                lines.append(
                    f"| {name} | {set_name} | {clf_name} | {f.n} | {f.n_hard} | {f.auc_cells()} "
                    f"| {mix.recall:.3f} | {f.within_length()} |"
                )
    return lines


def _opening(example: Example) -> Example:
    """A conversation's first user message as a request of its own."""
    first = next(m for m in example.body["messages"] if m.get("role") == "user")
    return replace(example, body={**example.body, "messages": [first]})


def heldout_report(model: TierClassifier, folder: Path) -> list[str]:
    lines = [
        "### Public held-out sets (bench/data/tier_heldout/; no classifier was fitted to them)",
        "",
        "Reasoning and planning asked in words, against the easy dialogues' openings as "
        "requests of their own; then whole conversations, labelled by their task, cut after "
        f"a user turn from the second on. Recall at the threshold sending {TARGET_SHARE:.0%} "
        f"large, on a resample to {HARD_SHARE_FOR_RECALL:.0%} hard.",
        "",
        "| test set | classifier | n | hard | ROC AUC | SE | recall@30% | AUC within length |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    easy_dialogues = [e for e in load_sources(DIALOGUES, folder) if not e.hard]
    openings = [_opening(e) for e in easy_dialogues]
    reasoning = load_sources(REASONING, folder)
    sets = [("reasoning and planning: " + " + ".join(REASONING), reasoning + openings)]
    sets += [(f"{s} (hard) + openings", [e for e in reasoning if e.source == s] + openings)
             for s in REASONING]  # fmt: skip
    talks = load_sources(DIALOGUES, folder)
    sets.append(("conversations: " + " + ".join(DIALOGUES), talks))
    for set_name, examples in sets:
        for clf_name, clf in classifiers(model):
            f, mix = figures(clf, examples), figures(clf, recall_mix(examples))
            lines.append(
                f"| {set_name} | {clf_name} | {f.n} | {f.n_hard} | {f.auc_cells()} "
                f"| {mix.recall:.3f} | {f.within_length()} |"
            )
    return lines


def own_report(model: TierClassifier, path: Path) -> list[str]:
    examples = load_examples(path)
    lines = [
        "### The project's own set (bench/data/tier_eval.jsonl; no classifier was fitted to it)",
        "",
        "Recall and precision of hard, and the share sent large, at the threshold that sends "
        f"{TARGET_SHARE:.0%} of the whole set large (the calibrated threshold's target).",
        "",
        "| classifier | requests | n | hard | ROC AUC | SE | sent large | recall | precision "
        "| AUC within length |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    subsets = (
        ("single-turn", [e for e in examples if _user_turns(e) <= 1]),
        ("multi-turn", [e for e in examples if _user_turns(e) > 1]),
    )
    thresholds: dict[str, float] = {}
    for name, clf in classifiers(model):
        whole = figures(clf, examples)
        thresholds[name] = whole.threshold
        rows = [("all", whole)]
        for subset, chosen in subsets:
            if len({e.hard for e in chosen}) == 2:  # no AUC without both labels
                rows.append((subset, figures(clf, chosen, whole.threshold)))
        for subset, f in rows:
            lines.append(
                f"| {name} | {subset} | {f.n} | {f.n_hard} | {f.auc_cells()} | {f.large_share:.2f} "
                f"| {f.recall:.3f} | {f.large_precision:.3f} | {f.within_length()} |"
            )
    return [*lines, "", *category_report(model, examples, thresholds["learned"])]


def category_report(
    model: TierClassifier, examples: Sequence[Example], threshold: float
) -> list[str]:
    """Where the learned classifier errs: each category's prompts sent large at the threshold
    sending TARGET_SHARE of the set large."""
    large: dict[tuple[str, str], list[bool]] = {}
    for e in examples:
        large.setdefault((e.category, e.label), []).append(model.score(e.body).score > threshold)
    lines = [
        f"Sent large by category (learned, at that threshold, {threshold:.3f}):",
        "",
        "| category | label | n | sent large |",
        "|---|---|---:|---:|",
    ]
    for (category, label), sent in sorted(large.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {category} | {label} | {len(sent)} | {sum(sent)} |")
    return lines


def _user_turns(example: Example) -> int:
    messages = example.body.get("messages") or []
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")


# --- the command line -------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        min_df=args.min_df, l2=args.l2, l2_request=args.l2_request,
        iterations=args.iterations, max_features=args.max_features,
        conversation_share=args.conversation_share,
    )  # fmt: skip


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument(
        "--min-df",
        type=positive_int,
        default=d.min_df,
        help=f"prompts a feature must occur in (default {d.min_df})",
    )
    parser.add_argument(
        "--l2", type=non_negative_float, default=d.l2, help=f"weight decay (default {d.l2})"
    )
    parser.add_argument(
        "--l2-request",
        type=non_negative_float,
        default=d.l2_request,
        help=f"weight decay of the request features (default {d.l2_request})",
    )
    parser.add_argument(
        "--iterations",
        type=positive_int,
        default=d.iterations,
        help=f"optimiser steps (default {d.iterations})",
    )
    parser.add_argument("--max-features", type=positive_int, default=d.max_features,
                        help=f"weights kept in the file (default {d.max_features})")  # fmt: skip
    parser.add_argument(
        "--conversation-share",
        type=share,
        default=d.conversation_share,
        help="share of prompts also trained on as two-turn conversations with a neutral "
        f"follow-up (default {d.conversation_share})",
    )


def _train(args: argparse.Namespace) -> int:
    examples: list[Example] = []
    for path in args.data:
        examples += load_examples(path)
    model = train(examples, _config(args), meta={"data": [Path(p).name for p in args.data]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    hard = sum(e.hard for e in examples)
    print(
        f"trained on {len(examples)} prompts ({hard} hard) from {len(args.data)} files: "
        f"{len(model.weights)} weights -> {args.out} ({args.out.stat().st_size // 1024} KiB)"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    model_path = str(args.model) if args.model else None
    model = load_learned(model_path)
    lines = [f"## Learned tier classifier ({args.model or 'shipped default model'})", ""]
    lines += [*split_report(args.train_data, _config(args)), ""]
    lines += [*heldout_report(model, args.heldout_data), ""]
    lines += [*own_report(model, args.own), ""]
    if not args.no_timing:
        corpus = [args.train_data / f"{name}.jsonl" for name in _PART_B]
        lines += [*timing_report(model_path, corpus), ""]
    sys.stdout.write("\n".join(lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway tiers", description=(__doc__ or "").splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="fit a learned tier model to labelled prompts")
    p.add_argument("data", nargs="+", type=Path, help="labelled JSONL files")
    p.add_argument("--out", type=Path, required=True, help="model file to write (.json.gz)")
    _add_train_options(p)
    p.set_defaults(run=_train)
    p = sub.add_parser("eval", help="held-out splits, the own set and timings (Markdown)")
    p.add_argument("--model", type=Path, help="model file (default: the shipped one)")
    p.add_argument("--train-data", type=Path, default=TRAIN_DATA,
                   help="folder of the public sets that SPLITS names")  # fmt: skip
    p.add_argument("--heldout-data", type=Path, default=HELDOUT_DATA,
                   help="folder of the public held-out sets (build_heldout.py)")  # fmt: skip
    p.add_argument("--own", type=Path, default=DEFAULT_DATA, help="the project's own set")
    p.add_argument("--no-timing", action="store_true", help="skip the microbenchmark")
    _add_train_options(p)
    p.set_defaults(run=_eval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result: int = args.run(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return result
