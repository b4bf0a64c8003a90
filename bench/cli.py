"""``llm-gateway bench``: one sub-command per benchmark (a plugin of the gateway's CLI).

Each benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> int``, imported
only when it runs; adding one is one more row in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

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
    return interruptible(sub.prog, lambda: module.run(sub.parse_args([*rest, *argv[1:]])))


STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a tool run as Ctrl-C does. Their default ends the process at once, before
the run stops its children and removes its files (policies, logs) from $TMPDIR."""


def interruptible(prog: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status; Ctrl-C, SIGTERM or SIGHUP end it by cancelling its work (each
    run's clean-up stops every process it started), then one line and 128 + the signal's
    number, as a shell reports a command the signal ended, instead of a traceback."""
    received: list[int] = []

    def as_ctrl_c(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        # The handler Ctrl-C has now: asyncio's runner cancels its main task (the first time)
        # so that clean-up runs; outside a runner, Python's raises KeyboardInterrupt.
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    previous = {signum: signal.signal(signum, as_ctrl_c) for signum in STOPPING_SIGNALS}
    try:
        code = run()
    except KeyboardInterrupt:
        code = 128 + int(signal.SIGINT)
    finally:
        for stopping, handler in previous.items():
            signal.signal(stopping, handler)
    if received or code == 128 + signal.SIGINT:  # some runs catch Ctrl-C themselves
        signum = received[0] if received else int(signal.SIGINT)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"{prog}: interrupted ({name}); stopped what it had started", file=sys.stderr)
        return 128 + signum
    return code
