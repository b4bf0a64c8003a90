"""``llm-gateway bench overhead``: what a router adds on top of a replica that costs nothing.

One zero-delay simulated replica (every sim timing 0) and, in front of that same replica, this
gateway (round-robin), the bare Python relay of ``floor`` (the yardstick: what any Python
router on this loop pays) and, when installed, the peer routers vllm-router and sglang-router
(``--policy round_robin``), and the routing users run: this gateway prefix-aware (its default)
against the peers' ``--policy cache_aware``. The same small chat request is sent straight to
the replica and through each router in the same run, in batches interleaved across targets: the
order rotates every round (direct, gateway, vllm, sglang; then gateway, vllm, sglang, direct;
...) so that machine noise and warm-up land on every target alike. Non-streaming and streaming,
at the chosen concurrency and at concurrency 1 (where latency is the router's own cost, not
queueing behind other requests; it is also where a keep-alive stall on a streamed response
shows).

Besides latency and throughput, each router's CPU time per request is read from the kernel
(/proc/PID/task/*/schedstat) around its own batches only, and so is the replica's.

Client, routers and replica share this machine's cores: at high concurrency a router's
figures include competing with the client and the replica for CPU, as a sidecar on a busy
node would.
"""

# Modules: ``config`` (targets and results), ``runner`` (the measurement), ``report``, ``cli``,
# ``floor`` (the bare relay).

from __future__ import annotations

from bench.host import machine_description, process_cpu_s
from bench.overhead.cli import add_arguments, run
from bench.overhead.config import (
    DIRECT,
    FLOOR,
    GATEWAY,
    NOTES_MARKER,
    PEERS,
    PREFIX_AWARE,
    Cell,
    ChunkCells,
    OverheadConfig,
    OverheadResult,
    Side,
    Target,
    cache_aware_name,
)
from bench.overhead.features import FEATURES
from bench.overhead.report import (
    format_comparison,
    format_report,
    format_routing,
    format_table,
    keep_notes,
    ratio,
)
from bench.overhead.runner import round_order, run_overhead, split_requests, start_peers

__all__ = [
    "DIRECT",
    "FEATURES",
    "FLOOR",
    "GATEWAY",
    "NOTES_MARKER",
    "PEERS",
    "PREFIX_AWARE",
    "Cell",
    "ChunkCells",
    "OverheadConfig",
    "OverheadResult",
    "Side",
    "Target",
    "add_arguments",
    "cache_aware_name",
    "format_comparison",
    "format_report",
    "format_routing",
    "format_table",
    "keep_notes",
    "machine_description",
    "process_cpu_s",
    "ratio",
    "round_order",
    "run",
    "run_overhead",
    "split_requests",
    "start_peers",
]
