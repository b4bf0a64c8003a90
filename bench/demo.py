"""``llm-gateway demo``: prefix-aware routing against round-robin on a simulated fleet.

Four simulated vLLM replicas (real subprocesses with the sim's default timing) and two gateways
run on loopback. One multi-turn workload (groups with their own long system prompts, several
users per group, several rounds with short answers, each round resending the history) goes
through the prefix-aware gateway, then, after every replica's prefix cache is emptied, through
a round-robin one. Hit rates come from the replicas' own vllm: counters, never from the gateway.

The KV cache is sized so that the fleet's total equals the workload's working set (every system
prompt and every user's full history): the fleet can keep it all only if each replica keeps its
own part, and no single replica can even keep all the system prompts. That is the regime where
routing decides whether the cache works; with more KV every policy hits, with less none can.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import uvloop

from bench.cli import interruptible
from bench.driver import RunResult, percentile, replica_name, run_conversations
from bench.fleet_stats import CacheCounters, delta, fleet_counters, reset_prefix_caches, snapshot
from bench.launcher import start_gateway
from bench.workloads import Conversation, multi_turn_shared_prefix
from gateway.cli_types import positive_int
from replica.processes import ManagedProcess, ProcessStartError, start_sim_replicas

MODEL = "sim-model"
POLICIES = ("prefix-aware", "round-robin")


@dataclass(frozen=True, slots=True)
class DemoConfig:
    replicas: int = 4
    groups: int = 8
    users_per_group: int = 4
    rounds: int = 4
    system_tokens: int = 2048
    """SGLang's generated-shared-prefix default."""
    question_tokens: int = 64
    answer_tokens: int = 32
    concurrency: int = 16
    start_interval_s: float = 0.1
    """Users join one after another (vLLM's multi-round QA benchmark adds users over time)
    rather than all in one instant, when no cache anywhere could have the prompt yet."""
    block_size: int = 16
    fleet_kv_ratio: float = 1.0
    """The fleet's KV cache over the workload's working set."""
    seed: int = 0
    timeout_s: float = 60.0
    """Per request."""

    @property
    def working_set_tokens(self) -> int:
        """Every group's system prompt plus every user's full history, in tokens."""
        conversations = self.groups * self.users_per_group
        history = self.rounds * (self.question_tokens + self.answer_tokens)
        return self.groups * self.system_tokens + conversations * history

    @property
    def longest_request_tokens(self) -> int:
        """The last round's prompt and answer; chat template tokens are left out."""
        history = self.rounds * (self.question_tokens + self.answer_tokens)
        return self.system_tokens + history

    @property
    def kv_blocks(self) -> int:
        """KV blocks per replica: ``fleet_kv_ratio`` x the working set over the fleet, but room
        for at least two of the longest requests so that a tiny workload still runs."""
        fleet_share = self.fleet_kv_ratio * self.working_set_tokens / self.replicas
        tokens = max(fleet_share, 2 * self.longest_request_tokens)
        return math.ceil(tokens / self.block_size)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    def workload(self) -> list[Conversation]:
        return multi_turn_shared_prefix(
            self.groups,
            self.users_per_group,
            self.rounds,
            self.system_tokens,
            self.question_tokens,
            self.answer_tokens,
            self.seed,
        )


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One pass of the workload through a gateway with one routing policy."""

    policy: str
    run: RunResult
    cache: dict[str, CacheCounters]
    """Each replica's prefix-cache counter deltas over the pass, by replica name (host:port)."""

    @property
    def fleet_cache(self) -> CacheCounters:
        return fleet_counters(self.cache)

    @property
    def fleet_hit_rate(self) -> float:
        return self.fleet_cache.hit_rate or 0.0

    def requests_per_replica(self) -> Counter[str]:
        """From the x-gateway-replica header of each answered request."""
        return Counter(r.replica for r in self.run.results if r.replica is not None)

    def routes(self) -> Counter[str]:
        """From the x-gateway-route header of each answered request."""
        return Counter(r.route for r in self.run.results if r.route is not None)

    def ttft(self, q: float) -> float:
        """TTFT percentile ``q`` in seconds over the successful requests."""
        return percentile(self.run.ttfts(), q)


@dataclass(frozen=True, slots=True)
class DemoResult:
    config: DemoConfig
    replicas: tuple[str, ...]
    """Replica names as the gateway reports them in x-gateway-replica."""
    prefix_aware: PolicyRun
    round_robin: PolicyRun

    @property
    def hit_rate_ratio(self) -> float:
        """Prefix-aware's fleet hit rate over round-robin's."""
        baseline = self.round_robin.fleet_hit_rate
        return self.prefix_aware.fleet_hit_rate / baseline if baseline else math.inf


def _policy(policy: str, replica_urls: Sequence[str]) -> dict[str, Any]:
    return {"pools": {"demo": {"model": MODEL, "replicas": list(replica_urls), "policy": policy}}}


async def _run_policy(
    policy: str,
    gateway: ManagedProcess,
    urls: Sequence[str],
    workload: Sequence[Conversation],
    config: DemoConfig,
    progress: bool,
) -> PolicyRun:
    # Each policy starts from empty caches and is measured by counter deltas.
    await reset_prefix_caches(urls)
    before = await snapshot(urls)
    run = await run_conversations(
        gateway.url,
        workload,
        model=MODEL,
        concurrency=config.concurrency,
        timeout_s=config.timeout_s,
        start_interval_s=config.start_interval_s,
        progress=progress,
        description=policy,
    )
    cache = delta(before, await snapshot(urls))
    return PolicyRun(policy, run, {replica_name(url): counters for url, counters in cache.items()})


async def run_demo(config: DemoConfig | None = None, *, progress: bool = False) -> DemoResult:
    """Start the fleet and both gateways, run the workload through each policy in turn, and
    stop every process started here, also on error or cancellation (Ctrl-C)."""
    config = config or DemoConfig()
    workload = config.workload()
    processes: list[ManagedProcess] = []
    try:
        sims = await start_sim_replicas(
            config.replicas,
            model=MODEL,
            num_blocks=config.kv_blocks,
            block_size=config.block_size,
        )
        processes += sims
        urls = [sim.url for sim in sims]
        runs = []
        for policy in POLICIES:
            gateway = await start_gateway(_policy(policy, urls), env=defaults_env())
            processes.append(gateway)
            runs.append(await _run_policy(policy, gateway, urls, workload, config, progress))
            await gateway.stop()
    finally:
        # Shielded: after Ctrl-C cancels this task, the children must still be stopped.
        stops = asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
        await asyncio.shield(stops)
    return DemoResult(config, tuple(replica_name(url) for url in urls), runs[0], runs[1])


def defaults_env() -> dict[str, str | None]:
    """The gateways' environment: the caller's less every GATEWAY_* variable. The demo shows
    the gateway's defaults against each other, and a shell set up for a real gateway (its
    GATEWAY_REDIS_URL, GATEWAY_WORKERS, GATEWAY_POLICY, GATEWAY_ADMIN_TOKEN...) would change
    what the demo measures, share state with that gateway's Redis, or stop it from starting."""
    return {name: None for name in os.environ if name.startswith("GATEWAY_")}


def start_failure(exc: ProcessStartError) -> str:
    """One short message for a child that did not start: what happened, then the last lines
    of its output, which say why (a traceback's last line, a refused setting)."""
    what, _, log = str(exc).partition("\n")
    tail = [line.strip() for line in log.splitlines() if line.strip()][-3:]
    return "\n".join([f"error: {what}; its output ends:", *(f"  {line}" for line in tail)])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{1000 * seconds:.1f} ms"  # nan: none succeeded


def _ratio(result: DemoResult) -> str:
    # Round-robin hitting nothing (a workload with nothing to reuse) leaves no ratio to show.
    ratio = result.hit_rate_ratio
    return f"{ratio:.2f}x" if math.isfinite(ratio) else "-"


def format_report(result: DemoResult) -> str:
    """The demo's printed report."""
    c = result.config
    pa, rr = result.prefix_aware, result.round_robin
    system_share = c.kv_tokens / (c.groups * c.system_tokens)
    lines = [
        "",
        f"Fleet: {c.replicas} simulated vLLM replicas, KV cache {c.kv_tokens:,} tokens each "
        f"({c.kv_blocks} blocks of {c.block_size}):",
        f"  together they hold {c.replicas * c.kv_tokens / c.working_set_tokens:.2f}x the "
        f"workload's working set ({c.working_set_tokens:,} tokens);",
        f"  one replica holds {100 * system_share:.0f}% of the groups' system prompts.",
        f"Workload: {c.groups} groups x {c.users_per_group} users x {c.rounds} rounds = "
        f"{pa.run.planned} chat requests per policy;",
        f"  system prompt {c.system_tokens:,} tokens per group, questions {c.question_tokens} "
        f"and answers {c.answer_tokens} tokens,",
        f"  every round resends the history; {c.concurrency} requests in flight, "
        f"a user joins every {c.start_interval_s:g} s.",
        "",
        f"{'':24}{'prefix-aware':>22}{'round-robin':>22}",
        f"{'replica':24}{'requests':>12}{'hit rate':>10}{'requests':>12}{'hit rate':>10}",
    ]
    pa_counts, rr_counts = pa.requests_per_replica(), rr.requests_per_replica()
    for name in result.replicas:
        lines.append(
            f"{name:24}{pa_counts[name]:>12}{_pct(pa.cache[name].hit_rate):>10}"
            f"{rr_counts[name]:>12}{_pct(rr.cache[name].hit_rate):>10}"
        )
    rows = (
        (
            "fleet",
            f"{pa.run.sent:>12}{_pct(pa.fleet_hit_rate):>10}",
            f"{rr.run.sent:>12}{_pct(rr.fleet_hit_rate):>10}",
        ),
        ("", "", ""),
        ("prompt tokens prefilled", _prefilled(pa.fleet_cache), _prefilled(rr.fleet_cache)),
        ("TTFT p50", _ms(pa.ttft(50)), _ms(rr.ttft(50))),
        ("TTFT p90", _ms(pa.ttft(90)), _ms(rr.ttft(90))),
        ("failed requests", str(pa.run.failed), str(rr.run.failed)),
    )
    lines += [f"{label:24}{left:>22}{right:>22}".rstrip() for label, left, right in rows]
    lines += [
        "",
        "Routes taken (x-gateway-route):",
        f"  prefix-aware: {_routes(pa)}",
        f"  round-robin:  {_routes(rr)}",
        "",
        "Fleet prefix-cache hit rate (sum of hits / sum of queries, from the replicas' own "
        "vllm: counters):",
        f"  prefix-aware {_pct(pa.fleet_hit_rate)} vs round-robin {_pct(rr.fleet_hit_rate)}: "
        f"{_ratio(result)}",
    ]
    return "\n".join(lines) + "\n"


def _prefilled(counters: CacheCounters) -> str:
    return f"{round(counters.queries - counters.hits):,}"


def _routes(run: PolicyRun) -> str:
    return ", ".join(f"{route} {count}" for route, count in run.routes().most_common()) or "-"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoConfig()
    for flag, kind, value, text in (
        ("--replicas", positive_int, defaults.replicas, "simulated replicas"),
        ("--groups", positive_int, defaults.groups, "groups, each with its own system prompt"),
        ("--users-per-group", positive_int, defaults.users_per_group,
         "users (conversations) per group"),
        ("--rounds", positive_int, defaults.rounds, "rounds per conversation"),
        ("--concurrency", positive_int, defaults.concurrency, "requests in flight at most"),
        ("--seed", int, defaults.seed, "seed of the workload's text"),
    ):  # fmt: skip
        parser.add_argument(flag, type=kind, default=value, help=f"{text} (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def main(argv: Sequence[str]) -> int:
    """Entry point of ``llm-gateway demo`` (a plugin of the gateway's CLI)."""
    parser = argparse.ArgumentParser(prog="llm-gateway demo", description=__doc__)
    add_arguments(parser)
    return interruptible(parser.prog, lambda: run(parser.parse_args(argv)))


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Runs the demo and prints its report; 0 when every request succeeded."""
    config = DemoConfig(
        replicas=args.replicas,
        groups=args.groups,
        users_per_group=args.users_per_group,
        rounds=args.rounds,
        concurrency=args.concurrency,
        seed=args.seed,
    )
    print(
        f"Starting {config.replicas} simulated replicas and the gateway on loopback...",
        file=sys.stderr,
    )
    try:
        result = uvloop.run(run_demo(config, progress=not args.no_progress))
    except ProcessStartError as exc:
        print(start_failure(exc), file=sys.stderr)
        return 1
    out.write(format_report(result))
    return 0 if result.prefix_aware.run.failed + result.round_robin.run.failed == 0 else 1
