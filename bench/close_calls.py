"""``llm-gateway bench close-calls``: what a tier's close calls gain on two simulated pools.

A request scored within ``close_call_margin`` of the tier threshold goes to the pool where it
would wait least for that pool's speed (docs/routing.md, "Close calls"). This measures it
against the quality rule alone, like for like:

- Fleet: a `small` pool of 4 simulated replicas at the sims' default speed and a `large` pool
  of 2 replicas three times slower to prefill and decode, as a larger model is; prefix-aware
  routing within each pool; overflow off, so that only the close calls move requests between
  pools.
- Workload: conversations of 1 to 4 user turns. Each opens with a labelled public prompt
  (bench/data/tier_train, easy and hard alike) under its group's system prompt (1,000 tokens)
  and its own context (2,000 tokens, as a retrieved document would be), and goes on with
  neutral follow-ups (the tier training's, bench/tier_eval/conversations.py); they arrive as a
  Poisson process, the same arrivals for every target.
- Targets, one after another, the replicas' caches emptied before each: the quality rule at
  the threshold that sends 30% of the workload's requests large (the calibration's default
  target, computed from the workload's own scores); close calls at that threshold; and the
  quality rule at the threshold that sends the same share large as the close-call run did, the
  like-for-like baseline (found by classifying the workload's requests with the same model and
  conversation memory, without sending them).

Per target: requests sent large, conversations opened in the large pool (their first turns:
there, each a cold prefill of a whole context on the slower model), close calls, TTFT
p50/p90/p99, and each pool's TTFT p90.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.compare.cli import parse_seeds
from bench.compare.code_state import CodeState, code_line
from bench.driver import RequestResult, percentile, replica_name, run_conversations
from bench.fleet_stats import reset_prefix_caches
from bench.host import machine_description
from bench.launcher import start_gateway
from bench.tier_eval.conversations import REPLIES, TRAIN_FOLLOW_UPS
from bench.workloads import Conversation, poisson_arrivals, random_text
from gateway.cli_types import non_negative_float, non_negative_int, positive_float, positive_int
from replica.processes import ManagedProcess, start_sim_replicas
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings

TRAIN = Path(__file__).parent / "data" / "tier_train"
SMALL, LARGE, TIER_MODEL = "small", "large", "auto"
SLOWER = 3.0
"""How much slower the large pool's replicas prefill and decode than the small pool's."""
LARGE_SHARE = 0.3
"""Share of requests the quality rule sends large: the calibration's default target."""
ROUTE_CLOSE_CALL = "close-call"
CONTEXT_TOKENS = 2000
"""Tokens of each conversation's own context, behind its group's system prompt."""


@dataclass(frozen=True, slots=True)
class Workload:
    conversations: tuple[Conversation, ...]
    arrivals: tuple[float, ...]
    scores: tuple[tuple[float, ...], ...]
    """Each conversation's turns' tier scores, as the gateway's classifier gives them."""

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.scores)

    def share_large(self, threshold: float) -> float:
        """The share the quality rule sends large at ``threshold``: a turn goes large when it
        scores at or above it, or when an earlier turn of its conversation did."""
        large = 0
        for turns in self.scores:
            went = False
            for score in turns:
                went = went or score >= threshold
                large += went
        return large / max(self.requests, 1)

    def threshold_for(self, share: float) -> float:
        """The threshold at which the quality rule sends ``share`` of the requests large."""
        low, high = 0.0, 1.0
        for _ in range(40):  # share_large falls as the threshold rises
            middle = (low + high) / 2
            if self.share_large(middle) > share:
                low = middle
            else:
                high = middle
        return high

    def within(self, threshold: float, margin: float) -> float:
        """Share of the requests scored within ``margin`` of ``threshold``."""
        near = sum(abs(s - threshold) <= margin for turns in self.scores for s in turns)
        return near / max(self.requests, 1)


def _prompts(seed: int) -> list[str]:
    """Single-turn prompts of both labels from the training sets, shuffled."""
    prompts = []
    for path in sorted(TRAIN.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            messages = orjson.loads(line)["body"]["messages"]
            if len(messages) == 1 and messages[0]["role"] == "user":
                prompts.append(str(messages[0]["content"]))
    random.Random(f"{seed}:prompts").shuffle(prompts)
    return prompts


def build_workload(
    conversations: int,
    rate: float,
    seed: int,
    *,
    context_tokens: int = CONTEXT_TOKENS,
    groups: int = 6,
    system_tokens: int = 1000,
) -> Workload:
    rng = random.Random(f"{seed}:close-calls")
    systems = [
        random_text(random.Random(f"{seed}:system:{g}"), system_tokens) for g in range(groups)
    ]
    openings = _prompts(seed)
    built = []
    for i in range(conversations):
        follow_ups = rng.sample(TRAIN_FOLLOW_UPS, rng.randint(0, 3))
        group = rng.randrange(groups)
        # The conversation's own context (a retrieved document, say) after the group's system
        # prompt: the history a pool holds of it. The classifier reads only user messages.
        system = systems[group] + "\n\n" + random_text(rng, context_tokens)
        questions = (openings[i % len(openings)], *follow_ups)
        built.append(Conversation(f"cc-{seed}-{i}", group, system, questions, 64))
    router = TierRouter(TIER_MODEL, TierSettings(small=SMALL, large=LARGE))
    scores = tuple(tuple(_scores(router, c)) for c in built)
    return Workload(tuple(built), tuple(poisson_arrivals(len(built), rate, seed)), scores)


def _scores(router: TierRouter, conversation: Conversation) -> Iterator[float]:
    """The classifier reads the first and latest user messages: the answers are stand-ins."""
    answers: list[str] = []
    for round_ in range(conversation.rounds):
        spec = conversation.request(round_, answers)
        yield router.classifier.score({"model": TIER_MODEL, "messages": list(spec.messages)}).score
        answers.append(REPLIES[round_ % len(REPLIES)])


OVERFLOW_OFF = {"enabled": False}
"""Only the close calls move requests between pools."""


def policy(
    small: Sequence[str],
    large: Sequence[str],
    threshold: float,
    margin: float,
    overflow: dict[str, bool] = OVERFLOW_OFF,
) -> dict[str, Any]:
    return {
        "pools": {
            SMALL: {"model": "sim-small", "replicas": list(small), "policy": "prefix-aware"},
            LARGE: {"model": "sim-large", "replicas": list(large), "policy": "prefix-aware"},
        },
        "tiers": {
            TIER_MODEL: {
                "small": SMALL,
                "large": LARGE,
                "threshold": threshold,
                "close_call_margin": margin,
                "overflow": overflow,
            }
        },
    }


@dataclass(frozen=True, slots=True)
class Outcome:
    label: str
    threshold: float
    margin: float
    results: tuple[RequestResult, ...]
    large: frozenset[str]
    """The large pool's replica names (x-gateway-replica)."""

    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok and r.ttft_s is not None]

    def share_large(self) -> float:
        ok = self.ok()
        return sum(r.replica in self.large for r in ok) / max(len(ok), 1)

    def first_turns_large(self) -> int:
        """Conversations opened in the large pool: its cold prefills of a whole context, which
        cost more there than all their later, cached turns."""
        return sum(r.round == 0 and r.replica in self.large for r in self.ok())

    def close_calls(self) -> int:
        return sum(r.route == ROUTE_CLOSE_CALL for r in self.results)

    def ttft_ms(self, q: float, pool: str | None = None) -> float:
        ok = self.ok()
        if pool is not None:
            ok = [r for r in ok if (r.replica in self.large) == (pool == LARGE)]
        return 1000 * percentile([r.ttft_s for r in ok if r.ttft_s is not None], q)


async def run_target(
    label: str,
    workload: Workload,
    small: Sequence[ManagedProcess],
    large: Sequence[ManagedProcess],
    threshold: float,
    margin: float,
    overflow: dict[str, bool] = OVERFLOW_OFF,
) -> Outcome:
    """One target's run of the workload, the replicas' caches emptied first."""
    urls = [p.url for p in (*small, *large)]
    await reset_prefix_caches(urls)
    gateway = await start_gateway(
        policy([p.url for p in small], [p.url for p in large], threshold, margin, overflow)
    )
    try:
        run = await run_conversations(
            gateway.url, workload.conversations, model=TIER_MODEL, concurrency=256,
            arrivals=workload.arrivals, description=label,
        )  # fmt: skip
    finally:
        await gateway.stop()
    names = frozenset(replica_name(p.url) for p in large)
    return Outcome(label, threshold, margin, run.results, names)


@contextlib.asynccontextmanager
async def sim_pools(
    small_replicas: int = 4, large_replicas: int = 2
) -> AsyncIterator[tuple[list[ManagedProcess], list[ManagedProcess]]]:
    """The small pool's simulated replicas and the large pool's, SLOWER times slower."""
    processes: list[ManagedProcess] = []
    try:
        small = await start_sim_replicas(small_replicas, model="sim-small")
        processes += small
        slow = {"prefill_s_per_token": 5e-5 * SLOWER, "decode_step_s": 0.008 * SLOWER}
        large = await start_sim_replicas(large_replicas, model="sim-large", **slow)
        processes += large
        yield small, large
    finally:
        await asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)


async def measure(workload: Workload, margin: float) -> list[Outcome]:
    async with sim_pools() as (small, large):
        threshold = workload.threshold_for(LARGE_SHARE)
        quality = await run_target("quality rule", workload, small, large, threshold, 0.0)
        close = await run_target("close calls", workload, small, large, threshold, margin)
        matched = workload.threshold_for(close.share_large())
        same = await run_target("quality rule, same share", workload, small, large, matched, 0.0)
        return [quality, close, same]


def table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| target | threshold | margin | sent large | opened large | close calls | TTFT p50 | p90 "
        "| p99 | small pool p90 | large pool p90 | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        failed = len(o.results) - len(o.ok())
        lines.append(
            f"| {o.label} | {o.threshold:.3f} | {o.margin:g} | {o.share_large():.1%} "
            f"| {o.first_turns_large()} | {o.close_calls()} | {o.ttft_ms(50):.0f} ms "
            f"| {o.ttft_ms(90):.0f} ms | {o.ttft_ms(99):.0f} ms | {o.ttft_ms(90, SMALL):.0f} ms "
            f"| {o.ttft_ms(90, LARGE):.0f} ms | {failed} |"
        )
    return "\n".join(lines) + "\n"


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The seeds and report file every two-pool benchmark takes."""
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default="1,2,3",
        help="workload seeds (tuning: 0; report: 1,2,3, the default)",
    )
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")


def report_over_seeds(
    args: argparse.Namespace,
    title: str,
    command: str,
    doc: str | None,
    section: Callable[[int], str],
) -> int:
    """Runs a two-pool benchmark's ``section`` on each seed of ``args.seeds``, printing each,
    and writes them to ``args.out`` where asked, under its command, code and machine and the
    description from its module docstring (after the first paragraph)."""
    if args.out is not None:  # before the seeds run, not after: a bad path fails at once
        args.out.parent.mkdir(parents=True, exist_ok=True)
    started = CodeState.now()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    sections = []
    seeds = ",".join(map(str, args.seeds))
    for seed in args.seeds:
        sections.append(section(seed))
        sys.stdout.write(f"\n{sections[-1]}")
    if args.out is not None:
        text = "\n".join(
            [
                f"# {title}",
                "",
                f"Generated by `{command} --seeds {seeds} --out {args.out}` (do not edit by hand).",
                f"{when}; code: {code_line(started, CodeState.now())}; {machine_description()}.",
                "",
                (doc or "").split("\n\n", 1)[1].strip(),
                "",
                *sections,
            ]
        )
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conversations", type=positive_int, default=240, help="per seed")
    parser.add_argument("--rate", type=positive_float, default=4.0, help="conversations per second")
    parser.add_argument(
        "--context-tokens",
        type=non_negative_int,
        default=CONTEXT_TOKENS,
        help="each conversation's own context, in tokens (0: none; a pool then holds little "
        "of a conversation beyond its group's system prompt)",
    )
    parser.add_argument(
        "--margin",
        type=non_negative_float,
        default=0.02,
        help="close_call_margin (chosen on seed 0: 15%% of its requests within it)",
    )
    add_report_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def section(seed: int) -> str:
        workload = build_workload(
            args.conversations, args.rate, seed, context_tokens=args.context_tokens
        )
        threshold = workload.threshold_for(LARGE_SHARE)
        head = (
            f"Seed {seed}: {workload.requests} requests in {len(workload.conversations)} "
            f"conversations; {workload.within(threshold, args.margin):.0%} of them scored within "
            f"{args.margin:g} of the threshold {threshold:.3f}."
        )
        print(head, file=sys.stderr)
        outcomes = uvloop.run(measure(workload, args.margin))
        close, same = outcomes[1], outcomes[2]
        ratio = close.ttft_ms(90) / same.ttft_ms(90)
        ratios = f"Close calls' TTFT p90 / the same share's: {ratio:.2f}x"
        return f"{head}\n\n{table(outcomes)}\n{ratios}\n"

    command = (
        f"llm-gateway bench close-calls --conversations {args.conversations} --rate "
        f"{args.rate:g} --context-tokens {args.context_tokens} --margin {args.margin:g}"
    )
    title = "Tier close calls against the quality rule"
    return report_over_seeds(args, title, command, __doc__, section)
