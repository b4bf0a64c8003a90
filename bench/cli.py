"""``llm-gateway bench``: one sub-command per benchmark.

Each benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> int``; adding one
(``bench compare``, ...) is one more row in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from types import ModuleType

from bench import compare, overhead, scaling, tier_eval

Runner = Callable[[argparse.Namespace], int]

BENCHMARKS: tuple[tuple[str, ModuleType, str], ...] = (
    ("overhead", overhead, "latency and throughput the gateway adds over a zero-delay replica"),
    (
        "tiers",
        tier_eval,
        "the tier classifier on the labelled prompt set: ROC AUC, calibrated share",
    ),
    (
        "compare",
        compare,
        "the gateway vs vllm-router and sglang-router on simulated and real fleets",
    ),
    ("scaling", scaling, "HPA response to the autoscaling signal: step and ramp simulation"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module, summary in BENCHMARKS:
        sub = benchmarks.add_parser(
            name,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        # Not "func": the top-level parser already uses that name for `bench` itself.
        sub.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    runner: Runner = args.bench_run
    return runner(args)
