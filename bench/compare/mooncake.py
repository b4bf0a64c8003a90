"""Real traffic no one here wrote: windows of Mooncake's public traces (conversation and
synthetic), replayed on a simulated fleet of their own.

A window (minutes of a trace; a default run replays the shipped one, bench/data/mooncake/,
minutes 29-34 of the conversation trace's hour, 1,023 requests; ``--traces`` reads or
downloads the whole traces for any other) is sent open loop at the trace's own timestamps,
10x faster, with every length x 3/16: a 512-token trace block becomes a 96-token text block
(shared hash ids share bytes), so five minutes replay in 30 s and send cold prompt tokens at
~45% of the fleet's prefill capacity, the load level of the default fleet's workloads. The
conversations reuse their history minutes apart, so the working set is far larger than the
default sims' KV cache (16k tokens): this fleet's sims hold 6x that, enough for ~0.8x of the
trace's bound with ideal routing (``lru_reuse``), so that routing, not cache size alone,
decides the hit rate.
"""

from __future__ import annotations

import argparse
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.compare.phases import PhaseSpec
from bench.compare.plan import MOONCAKE, SIM_REPLICAS, PlannedWorkload
from bench.compare.results import PREFIX_AWARE, WorkloadInfo
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

RATE_SCALE = 10.0
LENGTH_SCALE = 0.1875
"""3/16: a 512-token trace block is 96 tokens (384 characters) here; the conversation trace's
longest prompt (126,195 tokens) becomes 23,662, the synthetic trace's (191,378) 35,883."""
OUTPUT_SCALE = 0.09375
"""3/32: the window's mean output of ~340 tokens becomes ~32, the other workloads' output, for
the reason SimScale gives (every output token is a chunk this machine's 2 cores stream)."""
MOONCAKE_SIM: dict[str, Any] = {"num_blocks": 6144, "max_model_len": 65536}
"""The sims' settings on this fleet (the rest are the defaults): 6x the default KV cache, and
room for the synthetic trace's longest prompt (191,378 tokens, 35,883 here)."""
TTFT_OBJECTIVE_S = 0.5
"""A request is good when its first token comes within this: ~5x the cold prefill of the
window's median prompt on an idle replica. 28 of the 1,023 prompts (3%) take longer than that
to prefill cold, so they count as good only when a replica already holds their history: the
objective rewards keeping long conversations where their cache is. (At 2 s, the overload
workload's objective, every request of a trial run was good, for every target.)"""

SHIPPED = (
    Path(__file__).resolve().parent.parent / "data" / "mooncake" / "conversation_1740s-2040s.jsonl"
)
"""Lines of the conversation trace with 1,740 s <= timestamp < 2,040 s, unchanged: the window
a default run replays with no download."""
TRACE_FILES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}
"""The public traces a window can come from, by the file names of FAST25-release/traces/."""
TRACES_URL = (
    "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
    "3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/"
)
"""Where ``--traces download`` fetches the whole traces from (the commit the shipped window
was cut from)."""
CACHE_DIR = Path(".cache") / "mooncake"
"""Where downloaded traces are kept, under the working directory."""


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """Minutes [start, end) of one of Mooncake's traces."""

    trace: str
    start_min: float
    end_min: float

    @property
    def key(self) -> str:
        """The workload's key in the report: ``mooncake-conversation-29-34``."""
        return f"{MOONCAKE}-{self.trace}-{self.start_min:g}-{self.end_min:g}"

    def __str__(self) -> str:
        return f"{self.trace}:{self.start_min:g}-{self.end_min:g}"


def parse_window(text: str) -> TraceWindow:
    """``conversation:29-34`` (trace minutes; the trace defaults to the conversation trace)."""
    trace, _, span = text.rpartition(":")
    trace = trace or "conversation"
    start, sep, end = span.partition("-")
    try:
        window = TraceWindow(trace, float(start), float(end))
    except ValueError:
        window = None
    if window is None or not sep or trace not in TRACE_FILES or window.start_min >= window.end_min:
        raise argparse.ArgumentTypeError(
            f"a window is TRACE:START-END in trace minutes, TRACE one of "
            f"{', '.join(TRACE_FILES)} (e.g. conversation:29-34): {text!r}"
        )
    return window


SHIPPED_WINDOW = TraceWindow("conversation", 29, 34)
TUNING_WINDOWS = (
    TraceWindow("conversation", 4, 9),
    TraceWindow("conversation", 19, 24),
    TraceWindow("conversation", 44, 49),
    TraceWindow("synthetic", 0, 5),
    TraceWindow("synthetic", 5, 10),
)
"""Windows the routing's parameters may be chosen on (docs/benchmarks.md names them)."""
REPORT_WINDOWS = (
    SHIPPED_WINDOW,
    TraceWindow("conversation", 14, 19),
    TraceWindow("conversation", 39, 44),
    TraceWindow("conversation", 54, 59),
    TraceWindow("synthetic", 10, 15),
)
"""Windows no parameter was chosen on: the acceptance figures come from these alone."""
WINDOW_SETS = {"report": REPORT_WINDOWS, "tuning": TUNING_WINDOWS}
QUICK_MINUTES = 1.0
"""--quick replays each window's first minute only."""


def trace_path(window: TraceWindow, traces: str | None) -> Path:
    """The file ``window`` is read from: the shipped window when ``traces`` is None and it lies
    within it; else ``traces`` is a folder holding the trace files, or ``download`` (fetched
    once from TRACES_URL into CACHE_DIR)."""
    if traces is None:
        if window.trace == SHIPPED_WINDOW.trace and (
            SHIPPED_WINDOW.start_min <= window.start_min < window.end_min <= SHIPPED_WINDOW.end_min
        ):
            return SHIPPED
        raise FileNotFoundError(
            f"window {window} is outside the shipped one ({SHIPPED_WINDOW}): give the whole "
            "traces with --traces FOLDER, or --traces download"
        )
    name = TRACE_FILES[window.trace]
    if traces != "download":
        path = Path(traces) / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing (--traces names the folder of {name})")
        return path
    path = CACHE_DIR / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        print(f"[compare] downloading {TRACES_URL}{name} to {path}", file=sys.stderr)
        urllib.request.urlretrieve(TRACES_URL + name, partial)
        partial.replace(path)
    return path


def trace_problem(windows: Sequence[TraceWindow], traces: str | None) -> str | None:
    """Why a window cannot be replayed (None: every one can), for a command to say in one line
    before it starts anything; fetches the traces ``--traces download`` asks for."""
    for window in windows:
        try:
            path = trace_path(window, traces)
            if not window_records(window, path):
                return f"window {window} of {path} holds no request"
        except FileNotFoundError as exc:
            return str(exc)
        except OSError as exc:  # urllib's URLError: no network, or the file moved
            return f"cannot fetch the {window.trace} trace: {exc}"
        except ValueError as exc:  # a line that is not the trace's
            return str(exc)
    return None


def window_records(window: TraceWindow, path: Path, quick: bool = False) -> list[TraceRecord]:
    """The records the window replays, in file order."""
    start_s, end_s = _span_s(window, quick)
    return [r for r in read_trace(path) if start_s <= r.timestamp_ms / 1000 < end_s]


def _span_s(window: TraceWindow, quick: bool) -> tuple[float, float]:
    end = min(window.end_min, window.start_min + QUICK_MINUTES) if quick else window.end_min
    return 60.0 * window.start_min, 60.0 * end


def replay_seconds(window: TraceWindow, quick: bool) -> float:
    start_s, end_s = _span_s(window, quick)
    return (end_s - start_s) / RATE_SCALE


def cold_load(
    records: Sequence[TraceRecord], config: SimConfig, replicas: int, replay_s: float
) -> float:
    """Prompt tokens sent per second of the replay over the fleet's cold-prefill capacity (the
    share of it the replay would use if nothing hit)."""
    tokens = sum(r.input_length for r in records) * LENGTH_SCALE
    return tokens / replay_s * config.prefill_s_per_token / replicas


def slow_cold(records: Sequence[TraceRecord], config: SimConfig) -> int:
    """The requests whose cold prefill alone, on an idle replica, exceeds the objective."""
    limit = TTFT_OBJECTIVE_S / config.prefill_s_per_token / LENGTH_SCALE
    return sum(1 for r in records if r.input_length > limit)


def fleet_blocks(config: SimConfig, replicas: int) -> int:
    """The fleet's KV cache in (scaled) trace blocks."""
    block_tokens = TRACE_BLOCK_TOKENS * LENGTH_SCALE
    return int(replicas * config.num_blocks * config.block_size / block_tokens)


def mooncake_config() -> SimConfig:
    return SimConfig.model_validate(MOONCAKE_SIM)


def mooncake_workload(
    window: TraceWindow = SHIPPED_WINDOW,
    *,
    traces: str | None = None,
    quick: bool = False,
    seed: int = 0,
    replicas: int = SIM_REPLICAS,
) -> PlannedWorkload:
    """The window as it is sent; ``seed`` draws the block texts (the arrivals are the trace's)."""
    path = trace_path(window, traces)
    records = window_records(window, path, quick)
    if not records:
        raise ValueError(f"window {window} of {path} holds no request")
    start_s, end_s = _span_s(window, quick)
    schedule = mooncake_schedule(
        path,
        start_s=start_s,
        end_s=end_s,
        rate_scale=RATE_SCALE,
        length_scale=LENGTH_SCALE,
        output_scale=OUTPUT_SCALE,
        chars_per_token=CHARS_PER_TOKEN,
        seed=seed,
    )
    arrivals, conversations = split_schedule(schedule)
    summary = summarise(records)
    config = mooncake_config()
    replay_s = replay_seconds(window, quick)
    load = cold_load(records, config, replicas, replay_s)
    prompts = [len(c.questions[0]) // CHARS_PER_TOKEN for c in conversations]
    outputs = [c.max_tokens for c in conversations]
    block = round(TRACE_BLOCK_TOKENS * LENGTH_SCALE)
    shown = f"{window.trace}:{window.start_min:g}-{end_s / 60:g}"
    sets = [name for name, windows in WINDOW_SETS.items() if window in windows]
    info = WorkloadInfo(
        window.key,
        f"Mooncake {window.trace} trace, minutes {window.start_min:g}-{end_s / 60:g}",
        f"Mooncake's public {window.trace} trace (github.com/kvcache-ai/Mooncake, "
        f"FAST25-release/traces/{TRACE_FILES[window.trace]}, Apache-2.0): each request a "
        "timestamp, input and output lengths and the ids of its 512-token prefix blocks; each "
        "block id is materialised as a fixed text block, so shared ids share bytes "
        "(bench/workloads_mooncake.py). The tool-agent trace is not included: the copy within "
        "reach is a Git LFS pointer, not the data.",
        f"window {shown} ({len(records):,} requests; "
        f"{' and '.join(sets) + ' set' if sets else 'in neither the tuning nor the report set'}"
        f"); lengths x {LENGTH_SCALE:g} (a trace block = {block} tokens; prompts "
        f"mean {sum(prompts) / len(prompts):,.0f}, longest {max(prompts):,} tokens), outputs "
        f"x {OUTPUT_SCALE:g} (mean {sum(outputs) / len(outputs):.0f} tokens); one user "
        f"message per request. Cold prompt tokens at {load:.0%} of the fleet's prefill "
        f"capacity. The trace's own bound (from its hash ids: the share of prompt tokens in "
        f"blocks an earlier request of the window already had) is "
        f"{summary.token_reuse:.1%}; one LRU cache the fleet's size would serve "
        f"{lru_reuse(records, fleet_blocks(config, replicas)):.1%}. Goodput objective "
        f"{TTFT_OBJECTIVE_S:g} s ({slow_cold(records, config)} requests take longer to "
        "prefill cold on an idle replica).",
        total_requests(conversations),
        f"open loop at the trace's own timestamps, {RATE_SCALE:g}x faster ({replay_s:g} s, "
        f"{len(conversations) / replay_s:.1f} requests/s on average; the same for every target)",
        (seed,),
        trace_bound=summary.token_reuse,
    )
    spec = PhaseSpec((f"replay ({replay_s:g} s)",), ((0.0, replay_s),), TTFT_OBJECTIVE_S)
    return PlannedWorkload(info, conversations, arrivals, seed, phases=spec)


def mooncake_description(replicas: int) -> list[str]:
    config = mooncake_config()
    kv_tokens = config.num_blocks * config.block_size
    return [
        f"- Replicas: {replicas} simulated vLLM replicas with {config.num_blocks:,} KV blocks "
        f"of {config.block_size} tokens ({kv_tokens:,} tokens each, {replicas * kv_tokens:,} "
        f"for the fleet, {fleet_blocks(config, replicas):,} scaled trace blocks); other "
        f"settings default, but a {config.max_model_len:,}-token context. The windows' "
        "conversations come back minutes apart: with the default 16,384 tokens per replica "
        "not even ideal routing could keep their history.",
        "- Bounds: `hit / bound` reads the hit rate against the affinity bound over the "
        "prompts as sent (exact for this fleet); the trace's own bound, from its hash ids, is "
        "the same quantity before materialising (they differ by the chat template's few "
        "tokens and the 16-token blocks at each prompt's end), and `hit / trace bound` "
        "reads the hit rate against it.",
        "- Windows: a tuning set, on which routing parameters may be chosen "
        f"({', '.join(str(w) for w in TUNING_WINDOWS)}), and a report set, on which none was "
        f"({', '.join(str(w) for w in REPORT_WINDOWS)}); the acceptance checks read the "
        "report set's windows only, each on its own.",
        "- No target is given a TTFT objective (like for like). Goodput counts the requests "
        f"whose first token came within {TTFT_OBJECTIVE_S:g} s, per second of the replay, for "
        f"every target. `{OBJECTIVE_TARGET.label}` is the gateway told that objective "
        "(`cost.ttft_objective_s`), as an operator states an SLO: reported beside the others, "
        "read by no check.",
    ]


OBJECTIVE_TARGET = replace(PREFIX_AWARE, objective_s=TTFT_OBJECTIVE_S)
"""The gateway told the goodput objective: reported apart, since no peer can be told it."""

MOONCAKE_VARIANT = SimVariant(
    "mooncake", "Mooncake trace replay on a simulated fleet", mooncake_description, MOONCAKE_SIM
)
