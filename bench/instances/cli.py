"""Arguments and the run of ``llm-gateway bench instances``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace

from bench.compare.cli import parse_seeds
from bench.compare.plan import GSP, LOW, MRQA, ZIPF, SimScale, sim_workloads
from bench.instances.outage import outage_markdown, run_outage
from bench.instances.report import markdown
from bench.instances.runner import Layout, run_all
from bench.instances.sharing_cpu import sharing_cpu
from gateway.cli_types import positive_int

SCALE = SimScale(groups=16, prompts_per_group=16, users=24, rounds=5, rate=16.0, user_rate=2.0)
"""``bench compare``'s workloads at half its fleet's size (4 replicas, not 8): half the groups
and half the arrival rate, so the system prompts need the same share of the fleet's KV cache
and the load is the same share of its capacity."""
QUICK = replace(SimScale.quick(), rate=16.0, user_rate=2.0)
SEEDED = (GSP, MRQA, ZIPF)
"""Run on every seed given. Unlike ``bench compare``, multi-round QA too: one seed of its 120
requests on 4 replicas moves max/mean by 0.13 per 4 requests on the busiest replica, coarser
than the balance bound (+0.05) it is held to; the low-sharing control stays on one seed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--instances", type=_counts, default="2,4",
        help="gateway instance counts to compare with one instance, comma-separated (2,4)",
    )  # fmt: skip
    parser.add_argument(
        "--unshared", type=_counts, default="2",
        help="instance counts also run without shared state, as the control ('' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--workloads", default=",".join((GSP, MRQA, LOW, ZIPF)),
        help="bench compare's sim workloads to run (gsp,mrqa,low,zipf)",
    )  # fmt: skip
    parser.add_argument(
        "--seeds", type=parse_seeds, default="0",
        help="workload seeds, comma-separated; gsp, mrqa and zipf run on each, low on the "
        "first; hit rates are over all seeds, max/mean the mean of each seed's (0)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=_counts, default="2",
        help="worker counts of one instance (`serve --workers N`), each run twice: the "
        "workers sharing with each other, and through Redis; comma-separated ('' for none)",
    )  # fmt: skip
    parser.add_argument("--replicas", type=positive_int, default=4, help="simulated replicas (4)")
    parser.add_argument("--quick", action="store_true", help="small workloads (a smoke run)")
    parser.add_argument(
        "--sharing-cpu", action="store_true",
        help="instead: gateway CPU per request of 2 instances, local vs sharing through Redis, "
        "and of 2 workers sharing without Redis",
    )  # fmt: skip
    parser.add_argument(
        "--outage", action="store_true",
        help="instead: Redis SIGKILLed mid-run under 2 instances; failures and hit rate by phase",
    )  # fmt: skip


def _counts(text: str) -> tuple[int, ...]:
    """``2,4`` -> (2, 4): counts of instances or workers, each compared with the one instance
    every run has; so each is 2 or more (a 1 or a 0 would be dropped unseen)."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"counts are integers separated by commas: {text!r}"
        ) from None
    if any(count < 2 for count in counts):
        raise argparse.ArgumentTypeError(
            f"each count is 2 or more (one instance is the baseline every run has): {text!r}"
        )
    return counts


def _listed(counts: tuple[int, ...]) -> str:
    return ",".join(map(str, counts))


def run(args: argparse.Namespace) -> int:
    if args.outage:
        return _run_outage(args)
    if args.sharing_cpu:
        figures = asyncio.run(sharing_cpu())
        local, shared, workers = figures["local"], figures["redis"], figures["workers"]
        print("Command: `llm-gateway bench instances --sharing-cpu`\n")
        print(f"2 instances, local backend: {local:.0f} us of gateway CPU per request")
        print(f"2 instances, sharing through Redis: {shared:.0f} us ({shared / local - 1:+.1%})")
        print(
            f"1 instance of 2 workers sharing without Redis: {workers:.0f} us "
            f"({workers / local - 1:+.1%})"
        )
        return 0
    scale = QUICK if args.quick else SCALE
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    seeds = list(args.seeds)
    workloads = [w for w in sim_workloads(scale, seeds, SEEDED) if w.info.key in wanted]
    if not workloads:
        print(f"error: --workloads: no known workload in {args.workloads!r}", file=sys.stderr)
        return 2
    layouts = [Layout(1, False)]
    layouts += [Layout(n, True) for n in args.instances]
    layouts += [Layout(n, False) for n in args.unshared]
    layouts += [Layout(1, redis, workers=n) for n in args.workers for redis in (False, True)]
    command = (
        f"llm-gateway bench instances --instances {_listed(args.instances)} --unshared "
        f"'{_listed(args.unshared)}' --workers '{_listed(args.workers)}' "
        f"--workloads {','.join(wanted)} "
        f"--seeds {','.join(map(str, seeds))} --replicas {args.replicas}"
        + (" --quick" if args.quick else "")
    )
    started = time.perf_counter()
    rows = asyncio.run(run_all(layouts, workloads, args.replicas))
    print()
    print(markdown(rows, command))
    print(f"({time.perf_counter() - started:.0f} s)")
    failed = sum(r.measurement.errors for r in rows)
    return 1 if failed else 0


def _run_outage(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    prompts = 20 if args.quick else 40
    one, two = asyncio.run(run_outage(args.replicas, prompts))
    command = f"llm-gateway bench instances --outage --replicas {args.replicas}" + (
        " --quick" if args.quick else ""
    )
    print(outage_markdown(one, two, command))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 1 if one.failed or two.failed else 0
