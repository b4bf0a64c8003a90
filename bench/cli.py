"""``llm-gateway bench``: one sub-command per benchmark (a plugin of the gateway's CLI).

Each benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> int``, imported
only when it runs; adding one is one more row in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

BENCHMARKS: dict[str, tuple[str, str]] = {
    "overhead": (
        "bench.overhead",
        "latency and throughput the gateway adds over a zero-delay replica",
    ),
    "profile": (
        "bench.profile",
        "where the gateway's CPU goes per request (py-spy): a flame graph and the parts' shares",
    ),
    "tiers": (
        "bench.tier_eval",
        "the tier classifier on the labelled prompt set: ROC AUC, calibrated share",
    ),
    "compare": (
        "bench.compare",
        "the gateway vs vllm-router and sglang-router on simulated and real fleets",
    ),
    "decide": (
        "bench.decide",
        "time of one routing decision (fingerprint + select) on 8 and 64 replicas",
    ),
    "scaling": (
        "bench.scaling",
        "HPA response to the autoscaling signal: step and ramp simulation",
    ),
    "instances": (
        "bench.instances",
        "several gateway instances on one fleet: shared (Redis) vs one instance vs unshared",
    ),
    "soak": (
        "bench.soak",
        "minutes of mixed traffic: the gateway's RSS and /metrics size over time",
    ),
    "diagnose": (
        "bench.diagnose",
        "one Mooncake window, request by request: routes, and a model of the caches",
    ),
    "placement": (
        "bench.placement",
        "one Mooncake window through the routing at zero load, against modelled caches",
    ),
    "priority": (
        "bench.priority",
        "priority classes under overload: high kept, sheddable refused (x-gateway-priority)",
    ),
    "close-calls": (
        "bench.close_calls",
        "tier close calls to the pool where they wait least, against the quality rule",
    ),
    "overflow": (
        "bench.tier_overflow",
        "tier overflow by predicted TTFT, against overflow at saturation",
    ),
    "hang": (
        "bench.hang",
        "one of two workers SIGSTOPped: how soon throughput is back (the watchdog)",
    ),
}
EXTRA_MODULES = ("numpy", "matplotlib")
"""What the `bench` extra installs beyond the base install."""


def missing_extra() -> str | None:
    """The first module of the bench extra that this install lacks, if any."""
    return next((m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None), None)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway bench", description=__doc__)
    parser.add_argument("benchmark", choices=BENCHMARKS, metavar="BENCHMARK", help=", ".join(
        f"{name}: {summary}" for name, (_, summary) in BENCHMARKS.items()
    ))  # fmt: skip
    args, rest = parser.parse_known_args(argv[:1])
    module_name, summary = BENCHMARKS[args.benchmark]
    missing = missing_extra()
    if missing is not None:
        print(
            f"error: the benchmarks need the bench extra ({missing} is missing): "
            "pip install 'llm-gateway[bench]'",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(
        prog=f"llm-gateway bench {args.benchmark}",
        description=module.__doc__ or summary,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(sub)
    code: int = module.run(sub.parse_args([*rest, *argv[1:]]))
    return code
