"""Real traffic no one here wrote: a window of Mooncake's public conversation trace, replayed
on a simulated fleet of its own.

The window (bench/data/mooncake/, minutes 29-34 of the trace's hour, 1,023 requests) is sent
open loop at the trace's own timestamps, 10x faster, with every length x 3/16: a 512-token
trace block becomes a 96-token text block (shared hash ids share bytes), so the replay lasts
30 s and sends cold prompt tokens at ~45% of the fleet's prefill capacity, the load level of
the default fleet's workloads. The window's conversations reuse their history minutes apart,
so its working set is far larger than the default sims' KV cache (16k tokens): this fleet's
sims hold 6x that, enough for ~0.8x of the trace's bound with ideal routing (``lru_reuse``),
so that routing, not cache size alone, decides the hit rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.compare.phases import PhaseSpec
from bench.compare.plan import MOONCAKE, SIM_REPLICAS, PlannedWorkload
from bench.compare.results import WorkloadInfo
from bench.compare.runner import SimVariant
from bench.workloads import CHARS_PER_TOKEN, split_schedule, total_requests
from bench.workloads_mooncake import (
    TRACE_BLOCK_TOKENS,
    TraceRecord,
    lru_reuse,
    mooncake_schedule,
    read_trace,
    summarise,
)
from replica.sim.config import SimConfig

WINDOW = (
    Path(__file__).resolve().parent.parent / "data" / "mooncake" / "conversation_1740s-2040s.jsonl"
)
"""Lines of the conversation trace with 1,740 s <= timestamp < 2,040 s, unchanged."""
WINDOW_START_S, WINDOW_END_S = 1740.0, 2040.0
QUICK_END_S = 1800.0
"""--quick replays the window's first minute only."""
RATE_SCALE = 10.0
LENGTH_SCALE = 0.1875
"""3/16: a 512-token trace block is 96 tokens (384 characters) here; the longest prompt of
the window (124,847 tokens) becomes 23,409, within the sims' 32,768-token context."""
OUTPUT_SCALE = 0.09375
"""3/32: the window's mean output of ~340 tokens becomes ~32, the other workloads' output, for
the reason SimScale gives (every output token is a chunk this machine's 2 cores stream)."""
MOONCAKE_SIM: dict[str, Any] = {"num_blocks": 6144}
"""The sims' settings on this fleet (the rest are the defaults): 6x the default KV cache."""
TTFT_OBJECTIVE_S = 0.5
"""A request is good when its first token comes within this: ~5x the cold prefill of the
window's median prompt on an idle replica. 28 of the 1,023 prompts (3%) take longer than that
to prefill cold, so they count as good only when a replica already holds their history: the
objective rewards keeping long conversations where their cache is. (At 2 s, the overload
workload's objective, every request of a trial run was good, for every target.)"""


def window_records(quick: bool = False) -> list[TraceRecord]:
    """The records the workload replays, in file order."""
    end = QUICK_END_S if quick else WINDOW_END_S
    if not WINDOW.is_file():
        raise FileNotFoundError(f"{WINDOW} is missing: the mooncake workload runs from a checkout")
    return [r for r in read_trace(WINDOW) if WINDOW_START_S <= r.timestamp_ms / 1000 < end]


def cold_load(
    records: Sequence[TraceRecord], config: SimConfig, replicas: int, quick: bool
) -> float:
    """Prompt tokens sent per second of the replay over the fleet's cold-prefill capacity (the
    share of it the replay would use if nothing hit)."""
    replay_s = replay_seconds(quick)
    tokens = sum(r.input_length for r in records) * LENGTH_SCALE
    return tokens / replay_s * config.prefill_s_per_token / replicas


def slow_cold(records: Sequence[TraceRecord], config: SimConfig) -> int:
    """The requests whose cold prefill alone, on an idle replica, exceeds the objective."""
    limit = TTFT_OBJECTIVE_S / config.prefill_s_per_token / LENGTH_SCALE
    return sum(1 for r in records if r.input_length > limit)


def replay_seconds(quick: bool) -> float:
    end = QUICK_END_S if quick else WINDOW_END_S
    return (end - WINDOW_START_S) / RATE_SCALE


def fleet_blocks(config: SimConfig, replicas: int) -> int:
    """The fleet's KV cache in (scaled) trace blocks."""
    block_tokens = TRACE_BLOCK_TOKENS * LENGTH_SCALE
    return int(replicas * config.num_blocks * config.block_size / block_tokens)


def mooncake_config() -> SimConfig:
    return SimConfig.model_validate(MOONCAKE_SIM)


def mooncake_workload(quick: bool, seed: int = 0, replicas: int = SIM_REPLICAS) -> PlannedWorkload:
    """The window as it is sent; ``seed`` draws the block texts (the arrivals are the trace's)."""
    records = window_records(quick)
    end = QUICK_END_S if quick else WINDOW_END_S
    schedule = mooncake_schedule(
        WINDOW,
        start_s=WINDOW_START_S,
        end_s=end,
        rate_scale=RATE_SCALE,
        length_scale=LENGTH_SCALE,
        output_scale=OUTPUT_SCALE,
        chars_per_token=CHARS_PER_TOKEN,
        seed=seed,
    )
    arrivals, conversations = split_schedule(schedule)
    summary = summarise(records)
    config = mooncake_config()
    replay_s = replay_seconds(quick)
    load = cold_load(records, config, replicas, quick)
    prompts = [len(c.questions[0]) // CHARS_PER_TOKEN for c in conversations]
    outputs = [c.max_tokens for c in conversations]
    block = round(TRACE_BLOCK_TOKENS * LENGTH_SCALE)
    window = f"{WINDOW_START_S / 60:g}-{end / 60:g}"
    info = WorkloadInfo(
        MOONCAKE,
        "Mooncake conversation trace",
        "Mooncake's public conversation trace (github.com/kvcache-ai/Mooncake, "
        "FAST25-release/traces/, Apache-2.0; one hour of Kimi's production chat traffic): "
        "each request a timestamp, input and output lengths and the ids of its 512-token "
        "prefix blocks; each block id is materialised as a fixed text block, so shared ids "
        "share bytes (bench/workloads_mooncake.py). The tool-agent trace is not included: "
        "the copy within reach is a Git LFS pointer, not the data.",
        f"trace minutes {window} ({len(records):,} requests; bench/data/mooncake/ says why "
        f"this window); lengths x {LENGTH_SCALE:g} (a trace block = {block} tokens; prompts "
        f"mean {sum(prompts) / len(prompts):,.0f}, longest {max(prompts):,} tokens), outputs "
        f"x {OUTPUT_SCALE:g} (mean {sum(outputs) / len(outputs):.0f} tokens); one user "
        f"message per request. Cold prompt tokens at {load:.0%} of the fleet's prefill "
        f"capacity. The trace's own bound (from its hash ids: the share of prompt tokens in "
        f"blocks an earlier request of the window already had) is "
        f"{summary.token_reuse:.1%}; one LRU cache the fleet's size would serve "
        f"{lru_reuse(records, fleet_blocks(config, replicas)):.1%}. TTFT objective "
        f"{TTFT_OBJECTIVE_S:g} s ({slow_cold(records, config)} requests take longer to "
        "prefill cold on an idle replica).",
        total_requests(conversations),
        f"open loop at the trace's own timestamps, {RATE_SCALE:g}x faster ({replay_s:g} s, "
        f"{len(conversations) / replay_s:.1f} requests/s on average; the same for every target)",
        (seed,),
        trace_bound=summary.token_reuse,
    )
    spec = PhaseSpec((f"replay ({replay_s:g} s)",), ((0.0, replay_s),), TTFT_OBJECTIVE_S)
    # The gateway is told the objective, as an operator states the pool's SLO in its policy.
    pool = {"cost": {"ttft_objective_s": TTFT_OBJECTIVE_S}}
    return PlannedWorkload(info, conversations, arrivals, seed, phases=spec, gateway_pool=pool)


def mooncake_description(replicas: int) -> list[str]:
    config = mooncake_config()
    kv_tokens = config.num_blocks * config.block_size
    return [
        f"- Replicas: {replicas} simulated vLLM replicas with {config.num_blocks:,} KV blocks "
        f"of {config.block_size} tokens ({kv_tokens:,} tokens each, {replicas * kv_tokens:,} "
        f"for the fleet, {fleet_blocks(config, replicas):,} scaled trace blocks); other "
        "settings default. The window's conversations come back minutes apart: with the "
        "default 16,384 tokens per replica not even ideal routing could keep their history.",
        "- Bounds: `hit / bound` reads the hit rate against the affinity bound over the "
        "prompts as sent (exact for this fleet); the trace's own bound, from its hash ids, is "
        "the same quantity before materialising (they differ by the chat template's few "
        "tokens and the 16-token blocks at each prompt's end), and `hit / trace bound` "
        "reads the hit rate against it.",
        f"- Goodput: requests whose first token came within {TTFT_OBJECTIVE_S:g} s, per "
        "second of the replay. The gateway's pool is told the objective "
        "(`cost.ttft_objective_s`), as in the overload workload. No acceptance check reads "
        "this workload: its figures are reported as measured.",
    ]


MOONCAKE_VARIANT = SimVariant(
    "mooncake", "Mooncake trace replay on a simulated fleet", mooncake_description, MOONCAKE_SIM
)
