"""The command line of ``llm-gateway bench tiers``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.tier_eval.evaluation import (
    DEFAULT_DATA,
    DEFAULT_PLOT,
    evaluate,
)
from bench.tier_eval.report import format_report, write_roc_plot
from gateway.cli_types import share


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-share",
        type=share,
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
