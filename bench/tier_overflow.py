"""``llm-gateway bench overflow``: what overflow by prediction gains on two simulated pools.

An easy request climbs to the large pool while the small pool has a queue and the large pool is
predicted to answer it sooner (`overflow.predicted`, docs/routing.md), before the small pool
saturates; overflow at saturation alone waits for `saturation_queue_per_replica` requests
queued per replica. Measured like for like on the simulated pools and the workload of ``bench
close-calls`` (a large pool three times slower than the small one, 2 replicas each by default;
conversations of 1 to 4 turns under their group's system prompt and their own context, the
same Poisson arrivals for every target), the threshold sending 30% of the requests large by
the quality rule:

- no overflow: the quality rule alone;
- overflow at saturation (`predicted: false`, the rule before);
- overflow by prediction (`predicted: true`);
- the quality rule at the threshold that sends as many requests large as overflow by
  prediction served there: whether the climbs beat sending more requests large by score.

Per target: the share of requests served large, the climbs (`x-gateway-route: overflow`), TTFT
p50/p90/p99, and TTFT p90 of the requests the quality rule calls easy and of those it calls
hard: a climb must not make the hard requests pay for the easy ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import uvloop

from bench.close_calls import (
    LARGE,
    LARGE_SHARE,
    OVERFLOW_OFF,
    SLOWER,
    SMALL,
    Outcome,
    Workload,
    add_report_arguments,
    build_workload,
    report_over_seeds,
    run_target,
    sim_pools,
)
from bench.driver import percentile
from gateway.cli_types import positive_float, positive_int

ROUTE_OVERFLOW = "overflow"
AT_SATURATION = {"enabled": True, "predicted": False}
BY_PREDICTION = {"enabled": True, "predicted": True}


@dataclass(frozen=True, slots=True)
class Target:
    outcome: Outcome
    hard: frozenset[tuple[str, int]]
    """(conversation, round) of the requests the quality rule sends large at the report's
    threshold."""

    def climbs(self) -> int:
        return sum(r.route == ROUTE_OVERFLOW for r in self.outcome.results)

    def ttft_ms(self, q: float, hard: bool) -> float:
        ok = [r for r in self.outcome.ok() if ((r.conversation, r.round) in self.hard) == hard]
        return 1000 * percentile([r.ttft_s for r in ok if r.ttft_s is not None], q)


def hard_requests(workload: Workload, threshold: float) -> frozenset[tuple[str, int]]:
    """The requests the quality rule sends large at ``threshold`` (a conversation that went
    large stays large), as ``Workload.share_large`` counts them."""
    hard = set()
    for conversation, scores in zip(workload.conversations, workload.scores, strict=True):
        went = False
        for round_, score in enumerate(scores):
            went = went or score >= threshold
            if went:
                hard.add((conversation.id, round_))
    return frozenset(hard)


async def measure(workload: Workload, small_replicas: int, large_replicas: int) -> list[Outcome]:
    threshold = workload.threshold_for(LARGE_SHARE)
    async with sim_pools(small_replicas, large_replicas) as (small, large):
        none = await run_target("no overflow", workload, small, large, threshold, 0.0)
        saturation = await run_target(
            "overflow at saturation", workload, small, large, threshold, 0.0, AT_SATURATION
        )
        predicted = await run_target(
            "overflow by prediction", workload, small, large, threshold, 0.0, BY_PREDICTION
        )
        matched = workload.threshold_for(predicted.share_large())
        same = await run_target(
            "quality rule, same share", workload, small, large, matched, 0.0, OVERFLOW_OFF
        )
        return [none, saturation, predicted, same]


def table(targets: Sequence[Target]) -> str:
    lines = [
        "| target | threshold | served large | climbs | TTFT p50 | p90 | p99 | easy p90 "
        "| hard p90 | small pool p90 | large pool p90 | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in targets:
        o = t.outcome
        failed = len(o.results) - len(o.ok())
        lines.append(
            f"| {o.label} | {o.threshold:.3f} | {o.share_large():.1%} | {t.climbs()} "
            f"| {o.ttft_ms(50):.0f} ms | {o.ttft_ms(90):.0f} ms | {o.ttft_ms(99):.0f} ms "
            f"| {t.ttft_ms(90, hard=False):.0f} ms | {t.ttft_ms(90, hard=True):.0f} ms "
            f"| {o.ttft_ms(90, SMALL):.0f} ms | {o.ttft_ms(90, LARGE):.0f} ms | {failed} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=positive_int, default=240, help="per seed")
    parser.add_argument("--rate", type=positive_float, default=4.5, help="conversations per second")
    parser.add_argument(
        "--small-replicas", type=positive_int, default=2, help="the small pool's sims"
    )
    parser.add_argument(
        "--large-replicas",
        type=positive_int,
        default=2,
        help=f"the large pool's, {SLOWER:g}x slower",
    )
    add_report_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def section(seed: int) -> str:
        workload = build_workload(args.conversations, args.rate, seed)
        threshold = workload.threshold_for(LARGE_SHARE)
        hard = hard_requests(workload, threshold)
        head = (
            f"Seed {seed}: {workload.requests} requests in {len(workload.conversations)} "
            f"conversations at {args.rate:g} conversations/s; {args.small_replicas} small and "
            f"{args.large_replicas} large replicas; threshold {threshold:.3f}."
        )
        print(head, file=sys.stderr)
        outcomes = uvloop.run(measure(workload, args.small_replicas, args.large_replicas))
        targets = [Target(o, hard) for o in outcomes]
        _, saturation, predicted, same = targets
        ratios = (
            f"Overflow by prediction, TTFT p90 over overflow at saturation's: "
            f"{predicted.outcome.ttft_ms(90) / saturation.outcome.ttft_ms(90):.2f}x (easy "
            f"{predicted.ttft_ms(90, False) / saturation.ttft_ms(90, False):.2f}x, hard "
            f"{predicted.ttft_ms(90, True) / saturation.ttft_ms(90, True):.2f}x); over the same "
            f"share's: {predicted.outcome.ttft_ms(90) / same.outcome.ttft_ms(90):.2f}x"
        )
        return f"{head}\n\n{table(targets)}\n{ratios}\n"

    command = (
        f"llm-gateway bench overflow --conversations {args.conversations} --rate "
        f"{args.rate:g} --small-replicas {args.small_replicas} --large-replicas "
        f"{args.large_replicas}"
    )
    title = "Tier overflow by prediction against overflow at saturation"
    return report_over_seeds(args, title, command, __doc__, section)
