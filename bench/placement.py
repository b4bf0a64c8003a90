"""``llm-gateway bench placement``: the prefix-aware routing's placements on a Mooncake window
at zero load, against a model of each replica's cache. No gateway, no replica, seconds a window.

The window's prompts go, in arrival order and at their replay times, through the policy itself
(``PrefixAware``: every replica idle, its index sized as the gateway sizes it from the sims' KV
capacity, the recent-dispatch counts kept as the gateway keeps them) and into an LRU of trace
blocks per replica that evicts a prompt's last blocks first, as vLLM and the sims do. What
placement alone decides is then told apart from what load and timing add (``bench diagnose``
measures the same routing on the sims):

- hit / bound of the policy's placements, of the peers' cache_aware rule's (best match above
  0.3 of the prompt, else the smallest tree) and of one LRU cache the fleet's size (what the
  peers reach on the sims on these windows: docs/benchmarks.md);
- hit / bound of one LRU 1.5 and 2 times the fleet's size: what more room would keep;
- hit / bound of one cache the fleet's size, and of a half, a quarter and an eighth of it, that
  evicts the block used again farthest ahead (Belady's rule: it knows the future), which
  tells what the cache's size costs from what evicting by recency costs;
- ``--jitter P --seeds N``: the same, with a share P of the requests no replica holds history
  for sent to a random replica instead, as a queue elsewhere would send them: how far one
  window's figure moves when a few placements change;
- the chance that a conversation's turn has a next turn within the window, by how many turns
  it has had there: how much a turn's history is worth keeping.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from bench.compare.mooncake import (
    RATE_SCALE,
    mooncake_config,
    mooncake_workload,
    parse_window,
    trace_path,
    trace_problem,
)
from bench.compare.plan import SIM_REPLICAS
from bench.diagnose import capacity_blocks, records_by_id
from bench.workloads import CHARS_PER_TOKEN
from bench.workloads_mooncake import (
    TraceRecord,
    lru_remember,
    lru_reuse,
    optimal_reuse,
    reused_blocks,
    reused_tokens,
    summarise,
)
from gateway.cli_types import positive_int, share
from router_policies.cost.rates import default_rates
from router_policies.decay import DecayedCount
from router_policies.decision import Candidate, Decision, PoolSnapshot
from router_policies.fingerprint import RequestFeatures, canonical_chat
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.schema import PoolPolicy

MODEL = "m"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window", type=parse_window, required=True, help="TRACE:START-END, as bench compare's"
    )
    parser.add_argument(
        "--traces", default="download", help="folder of the whole traces, or download"
    )
    parser.add_argument(
        "--jitter", type=share, default=0.0, help="share of new prompts sent at random"
    )
    parser.add_argument("--seeds", type=positive_int, default=5, help="jittered replays")


@dataclass(frozen=True, slots=True)
class Prompt:
    record: TraceRecord
    features: RequestFeatures
    at_s: float


NAMES = tuple(f"r{i}" for i in range(SIM_REPLICAS))
POOL = PoolPolicy(model=MODEL, replicas=[f"http://{n}:1" for n in NAMES])
"""The gateway's defaults: only the model and the replicas set, as bench compare runs it."""


def replay(prompts: Sequence[Prompt], capacity: int, jitter: float = 0.0, seed: int = 0) -> float:
    """The prompt-token share the placements' caches served."""
    policy = PrefixAware(POOL)
    rates = default_rates(POOL.cost)
    index_blocks = capacity_tokens() * CHARS_PER_TOKEN / POOL.prefix.block_bytes
    for name in NAMES:
        policy.size_index(name, int(index_blocks))
    recent = {n: DecayedCount(POOL.load.recent_half_life_s) for n in NAMES}
    caches: dict[str, OrderedDict[int, None]] = {n: OrderedDict() for n in NAMES}
    rng = random.Random(seed)
    served = total = 0
    for prompt in prompts:
        now = prompt.at_s
        candidates = tuple(Candidate(n, rates=rates, recent=recent[n].value(now)) for n in NAMES)
        snapshot = PoolSnapshot(candidates, now=now, chars_per_token=CHARS_PER_TOKEN)
        decision = policy.select(prompt.features, snapshot)
        assert decision is not None
        chosen = decision.replica
        held = {n: reused_blocks(prompt.record, caches[n]) for n in NAMES}
        if jitter and max(held.values()) <= 1 and rng.random() < jitter:
            chosen = rng.choice(NAMES)
        policy.record(prompt.features, Decision(chosen, decision.route), now)
        recent[chosen].add(now)
        served += reused_tokens(prompt.record, held[chosen])
        total += prompt.record.input_length
        lru_remember(caches[chosen], prompt.record, capacity, tail_first=True)
    return served / max(total, 1)


LARGER_SHARES = (("1.5x", 1.5), ("twice", 2.0))
"""Multiples of the fleet's cache given to one LRU: what a second tier of KV cache (an
engine's CPU offloading) would keep, if routing kept every history where it is held."""
OPTIMAL_SHARES = (
    ("the fleet's size", 1.0),
    ("half", 0.5),
    ("a quarter", 0.25),
    ("an eighth", 0.125),
)
"""The fleet's cache, and fractions of it, given to the cache that knows the future."""

CACHE_THRESHOLD = 0.3
"""vllm-router's and sglang-router's default cache_threshold (their router_args.py)."""


def cache_aware_replay(prompts: Sequence[Prompt], capacity: int) -> float:
    """The peers' cache_aware rule at zero load, against the same cache model: a prompt whose
    longest match on some replica's tree is more than CACHE_THRESHOLD of it goes to that
    replica, any other to the replica whose tree is smallest (the trees hold every block sent
    there, unevicted, as theirs do within minutes). Their load check never fires at zero
    load. The prompt-token share the placements' caches served."""
    trees: dict[str, set[int]] = {n: set() for n in NAMES}
    caches: dict[str, OrderedDict[int, None]] = {n: OrderedDict() for n in NAMES}
    served = total = 0
    for prompt in prompts:
        record = prompt.record
        matched = {n: reused_tokens(record, reused_blocks(record, trees[n])) for n in NAMES}
        best = max(NAMES, key=lambda n: matched[n])
        if matched[best] > CACHE_THRESHOLD * record.input_length:
            chosen = best
        else:
            chosen = min(NAMES, key=lambda n: len(trees[n]))
        served += reused_tokens(record, reused_blocks(record, caches[chosen]))
        total += record.input_length
        lru_remember(caches[chosen], record, capacity, tail_first=True)
        trees[chosen].update(record.hash_ids)
    return served / max(total, 1)


def next_turn_chances(
    records: Sequence[TraceRecord], deepest: int = 6
) -> list[tuple[int, int, float]]:
    """(turns so far, requests, the share of them a later request continues), the last row
    counting every deeper turn. A conversation is named by its second block (the first is the
    trace's shared one); a later request continues a turn when it holds the turn's last full
    block (the last one is partial and changes as the history grows)."""
    depth: dict[int, int] = {}
    turns: list[int] = []
    for record in records:
        ids = record.hash_ids
        key = ids[1] if len(ids) > 1 else None
        turn = depth[key] + 1 if key is not None and len(ids) > 2 and key in depth else 1
        if key is not None:
            depth[key] = turn
        turns.append(min(turn, deepest))
    later: set[tuple[int, int]] = set()
    counts = [[0, 0] for _ in range(deepest)]
    for record, turn in zip(reversed(records), reversed(turns), strict=True):
        ids = record.hash_ids
        counts[turn - 1][0] += 1
        counts[turn - 1][1] += len(ids) > 2 and (ids[1], ids[-2]) in later
        later.update((ids[1], h) for h in ids[1:])
    return [(i + 1, n, c / n) for i, (n, c) in enumerate(counts) if n]


def capacity_tokens() -> int:
    config = mooncake_config()
    return config.num_blocks * config.block_size


def run(args: argparse.Namespace) -> int:
    window = args.window
    problem = trace_problem([window], args.traces)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    path = trace_path(window, args.traces)
    workload = mooncake_workload(window, traces=args.traces)
    lines = records_by_id(path, workload)
    arrivals = workload.arrivals or [0.0] * len(workload.conversations)
    reader = PrefixAware(POOL)
    prompts: list[Prompt] = []
    for conversation, at in zip(workload.conversations, arrivals, strict=True):
        messages = conversation.request(0, []).messages
        features = reader.features(MODEL, functools.partial(canonical_chat, messages))
        prompts.append(Prompt(lines[conversation.id], features, at))
    records = [p.record for p in prompts]
    capacity = capacity_blocks()
    ceiling = summarise(records).token_reuse
    print(
        f"{window}: {len(prompts)} requests at replay time ({RATE_SCALE:g}x), bound {ceiling:.3f}"
    )
    fleet_blocks = capacity * SIM_REPLICAS
    fleet = lru_reuse(records, fleet_blocks, tail_first=True)
    print(f"one LRU the fleet's size: hit/bound {fleet / ceiling:.3f}")
    larger = ", ".join(
        f"{name} {lru_reuse(records, int(fleet_blocks * share), tail_first=True) / ceiling:.3f}"
        for name, share in LARGER_SHARES
    )
    print(f"one LRU larger than the fleet's cache (a second tier's room): hit/bound {larger}")
    room = ", ".join(
        f"{name} {optimal_reuse(records, int(fleet_blocks * share)) / ceiling:.3f}"
        for name, share in OPTIMAL_SHARES
    )
    print(f"one cache that evicts the block used again farthest ahead (Belady): hit/bound {room}")
    print(f"prefix-aware at zero load: hit/bound {replay(prompts, capacity) / ceiling:.3f}")
    peers = cache_aware_replay(prompts, capacity) / ceiling
    print(f"the peers' cache_aware rule at zero load: hit/bound {peers:.3f}")
    if args.jitter > 0:
        jittered = [replay(prompts, capacity, args.jitter, s) / ceiling for s in range(args.seeds)]
        print(
            f"with {args.jitter:.0%} of new prompts sent at random, {args.seeds} seeds: hit/bound "
            f"{min(jittered):.3f}-{max(jittered):.3f} (mean {statistics.fmean(jittered):.3f})"
        )
    chances = ", ".join(
        f"{t}{'+' if t == 6 else ''}: {p:.2f} of {n}" for t, n, p in next_turn_chances(records)
    )
    print(f"a next turn within the window, by turns so far: {chances}")
    return 0
