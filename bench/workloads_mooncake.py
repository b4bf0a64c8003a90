"""Replay of Mooncake's public production traces (github kvcache-ai/Mooncake,
``FAST25-release/traces/``: conversation, tool-agent and synthetic), scaled to a small fleet.

Each trace line is one request: ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}``, where hash id i names the i-th 512-token block of the prompt
(chained: equal ids mean an equal prefix up to that block), so ``len(hash_ids)`` is
``ceil(input_length / 512)`` and the last block is usually partial.

A request is materialised as a prompt whose text is its blocks' texts in order: each hash id
gets one fixed text block (seeded by the id alone, so shared ids share bytes across requests)
of ``512 x length_scale x chars_per_token`` characters, the last block cut so that the prompt
is ``input_length x length_scale x chars_per_token`` characters. The whole prompt is one user
message with no system prompt: the trace says nothing about roles.

A five-minute window of the conversation trace is in bench/data/mooncake/ (its README says
which and why; ``bench compare`` replays it); the whole traces are public data, not part of
this repository.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.workloads import CHARS_PER_TOKEN, Conversation, Schedule, pool_chars

TRACE_BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake's traces."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One line of a trace."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: Path | str) -> Iterator[TraceRecord]:
    """The records of a JSONL trace file, in file order (blank lines skipped)."""
    with Path(path).open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                yield TraceRecord(
                    int(row["timestamp"]),
                    int(row["input_length"]),
                    int(row["output_length"]),
                    tuple(int(i) for i in row["hash_ids"]),
                )
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace line ({exc})") from exc


class BlockTexts:
    """The fixed text of each hash id, ``block_chars`` long, made on first use (from
    ``pool_chars``: a window of a trace can hold tens of thousands of distinct blocks)."""

    def __init__(self, block_chars: int, seed: int = 0) -> None:
        if block_chars < 1:
            raise ValueError("a block needs at least one character")
        self.block_chars = block_chars
        self.seed = seed
        self._texts: dict[int, str] = {}

    def __getitem__(self, hash_id: int) -> str:
        text = self._texts.get(hash_id)
        if text is None:
            rng = random.Random(f"{self.seed}:mooncake:block:{hash_id}")
            text = self._texts[hash_id] = pool_chars(rng, self.block_chars)
        return text


def materialise(record: TraceRecord, blocks: BlockTexts, prompt_chars: int) -> str:
    """The prompt of one record: its blocks' texts in order, cut to ``prompt_chars``."""
    needed = math.ceil(prompt_chars / blocks.block_chars)
    if needed > len(record.hash_ids):
        raise ValueError(
            f"{prompt_chars} characters need {needed} blocks; the record has {len(record.hash_ids)}"
        )
    return "".join(blocks[i] for i in record.hash_ids[:needed])[:prompt_chars]


def mooncake_schedule(
    path: Path | str,
    *,
    start_s: float = 0.0,
    end_s: float = math.inf,
    rate_scale: float = 1.0,
    length_scale: float = 1.0,
    output_scale: float | None = None,
    chars_per_token: int = CHARS_PER_TOKEN,
    max_requests: int | None = None,
    seed: int = 0,
) -> Schedule:
    """The trace's requests with ``start_s <= timestamp < end_s`` (trace seconds), as
    (arrival offset, one-round request) pairs for ``run_conversations``.

    Arrival offsets are ``(timestamp - start_s) / rate_scale``: ``rate_scale`` 2 replays twice
    as fast. Prompts are ``input_length x length_scale`` tokens of ``chars_per_token``
    characters; ``max_tokens`` is ``output_length x output_scale`` (default ``length_scale``),
    at least 1. ``max_requests`` stops after that many requests of the window.
    """
    if rate_scale <= 0 or length_scale <= 0:
        raise ValueError("rate_scale and length_scale must be > 0")
    out_scale = length_scale if output_scale is None else output_scale
    block_chars = max(1, round(TRACE_BLOCK_TOKENS * length_scale * chars_per_token))
    blocks = BlockTexts(block_chars, seed)
    schedule: Schedule = []
    for line, record in enumerate(read_trace(path)):
        at_s = record.timestamp_ms / 1000.0
        if not start_s <= at_s < end_s:
            continue
        if max_requests is not None and len(schedule) >= max_requests:
            break
        prompt_chars = max(1, round(record.input_length * length_scale * chars_per_token))
        # Rounding the block size can leave the last block a few characters short.
        prompt_chars = min(prompt_chars, len(record.hash_ids) * block_chars)
        conversation = Conversation(
            id=f"m{line:06d}",
            group=record.hash_ids[0] if record.hash_ids else -1,
            system="",
            questions=(materialise(record, blocks, prompt_chars),),
            max_tokens=max(1, round(record.output_length * out_scale)),
        )
        schedule.append(((at_s - start_s) / rate_scale, conversation))
    schedule.sort(key=lambda pair: pair[0])
    return schedule


@dataclass(frozen=True, slots=True)
class TraceSummary:
    requests: int
    span_s: float
    """Last timestamp minus the first."""
    mean_input_tokens: float
    block_reuse: float
    """The trace's own bound, in blocks: the share of prompt blocks an unbounded cache holding
    every earlier prompt would serve (leading run of already-seen hash ids, as in a prefix
    cache)."""
    token_reuse: float = 0.0
    """The same bound in prompt tokens, as a fleet's hit rate is counted: a reused block
    counts its tokens (512, or fewer for a prompt's partial last block)."""


def reused_blocks(record: TraceRecord, seen: set[int] | Mapping[int, object]) -> int:
    """How many of the record's leading hash ids are in ``seen``: the blocks a prefix cache
    holding them would serve (ids are chained, so the run stops at the first unknown one)."""
    hits = 0
    for hash_id in record.hash_ids:
        if hash_id not in seen:
            break
        hits += 1
    return hits


def reused_tokens(record: TraceRecord, blocks: int) -> int:
    """The prompt tokens in the record's first ``blocks`` blocks."""
    return min(blocks * TRACE_BLOCK_TOKENS, record.input_length)


def summarise(records: Iterable[TraceRecord]) -> TraceSummary:
    """Line count, time span, mean input length and block-level reuse bound of records."""
    seen: set[int] = set()
    count = blocks = reused = inputs = reused_input = 0
    first = last = None
    for record in records:
        count += 1
        inputs += record.input_length
        first = record.timestamp_ms if first is None else min(first, record.timestamp_ms)
        last = record.timestamp_ms if last is None else max(last, record.timestamp_ms)
        hits = reused_blocks(record, seen)
        reused += hits
        reused_input += reused_tokens(record, hits)
        blocks += len(record.hash_ids)
        seen.update(record.hash_ids)
    span = (last - first) / 1000.0 if first is not None and last is not None else 0.0
    return TraceSummary(
        count,
        span,
        inputs / count if count else 0.0,
        reused / blocks if blocks else 0.0,
        reused_input / inputs if inputs else 0.0,
    )


def lru_remember(
    cache: OrderedDict[int, None],
    record: TraceRecord,
    capacity_blocks: int,
    *,
    tail_first: bool = False,
) -> None:
    """The record's blocks made the most recent of ``cache``, then the least recently used
    evicted down to ``capacity_blocks``. ``tail_first``: its first block made the most recent
    of all, so a prompt's tail is evicted before its head and what is kept of a history is a
    prefix, as vLLM and the sims evict (the default touches the blocks in prompt order)."""
    for hash_id in reversed(record.hash_ids) if tail_first else record.hash_ids:
        cache[hash_id] = None
        cache.move_to_end(hash_id)
    while len(cache) > capacity_blocks:
        cache.popitem(last=False)


def lru_reuse(
    records: Sequence[TraceRecord], capacity_blocks: int, *, tail_first: bool = False
) -> float:
    """The token share one prefix cache of ``capacity_blocks`` trace blocks, evicting the
    least recently used block, would serve over ``records`` in order.

    A fleet of caches that together hold that many blocks reaches this at best when routing
    keeps every prefix where it was last used (a rough ceiling: a real cache evicts from the
    leaf up, this one by recency alone unless ``tail_first``); the gap to ``token_reuse`` is
    what finite caches cost, whatever the routing.
    """
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must be >= 0")
    cache: OrderedDict[int, None] = OrderedDict()
    inputs = reused = 0
    for record in records:
        inputs += record.input_length
        reused += reused_tokens(record, reused_blocks(record, cache))
        lru_remember(cache, record, capacity_blocks, tail_first=tail_first)
    return reused / inputs if inputs else 0.0


def optimal_reuse(records: Sequence[TraceRecord], capacity_blocks: int) -> float:
    """The token share one prefix cache of ``capacity_blocks`` trace blocks would serve over
    ``records`` if it knew the future: when full, it evicts the block whose next use is
    farthest ahead (Belady's rule), so a block no later prompt uses goes first.

    No engine can evict this way; beside ``lru_reuse`` it tells what finite caches cost from
    what the order of eviction costs: the bound (``token_reuse``) reached here means the
    fleet's cache is large enough, and what an LRU loses is the blocks it keeps that nothing
    uses again.
    """
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must be >= 0")
    uses: defaultdict[int, list[int]] = defaultdict(list)
    for position, record in enumerate(records):
        for hash_id in record.hash_ids:
            uses[hash_id].append(position)
    seen: defaultdict[int, int] = defaultdict(int)
    """How many of each block's uses have happened."""
    never = len(records)
    cache: dict[int, int] = {}
    """Each cached block's next use."""
    farthest: list[tuple[int, int]] = []
    """(-next use, block) for every block cached, stale entries included (skipped on pop)."""
    inputs = reused = 0
    for record in records:
        inputs += record.input_length
        reused += reused_tokens(record, reused_blocks(record, cache))
        for hash_id in record.hash_ids:
            seen[hash_id] += 1
            later = uses[hash_id]
            next_use = later[seen[hash_id]] if seen[hash_id] < len(later) else never
            cache[hash_id] = next_use
            heapq.heappush(farthest, (-next_use, hash_id))
        while len(cache) > capacity_blocks:
            negative, hash_id = heapq.heappop(farthest)
            if cache.get(hash_id) == -negative:
                del cache[hash_id]
    return reused / inputs if inputs else 0.0
