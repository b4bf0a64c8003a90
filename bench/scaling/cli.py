"""The command line of ``llm-gateway bench scaling``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from bench.scaling.config import STRATEGY_KEYS, ScalingConfig, baseline_settings
from bench.scaling.plots import plot
from bench.scaling.report import format_report
from bench.scaling.simulation import run_scaling


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ScalingConfig()
    add = parser.add_argument
    add(
        "--cold-start-s",
        type=float,
        default=d.cold_start_s,
        help="seconds from pod creation until it serves (default: %(default)s)",
    )
    add("--seed", type=int, default=d.seed, help="arrivals seed (default: %(default)s)")
    add(
        "--out",
        type=Path,
        default=Path("docs"),
        help="folder for scaling-step.png and scaling-ramp.png (default: %(default)s)",
    )
    add("--no-out", action="store_true", help="print the report only, draw no plots")
    add(
        "--scrape-interval-s",
        type=float,
        default=d.scrape_interval_s,
        help="Prometheus scrape interval (default: %(default)s)",
    )
    add(
        "--hpa-sync-s",
        type=float,
        default=d.hpa_sync_s,
        help="HPA sync period; it runs half a period after a scrape (default: %(default)s)",
    )
    add(
        "--hpa-scale-down-window-s",
        type=float,
        default=d.hpa_scale_down_window_s,
        help="the HPA's scale-down stabilization window on the gateway's desired count, A and P "
        "(default: %(default)s; the gateway already stabilizes it)",
    )
    add(
        "--queue-hpa-scale-down-window-s",
        type=float,
        default=d.queue_hpa_scale_down_window_s,
        help="the HPA's scale-down stabilization window on a queue, B and C (default: %(default)s)",
    )
    add(
        "--base-rate",
        type=float,
        default=d.base_rate,
        help="requests/s before the step or ramp; min replicas serve it (default: %(default)s)",
    )
    add("--factor", type=float, default=d.factor, help="peak / base rate (default: %(default)s)")
    add(
        "--inflight-limit",
        type=int,
        default=None,
        help="the gateway's max_inflight_per_replica (default: none)",
    )
    add(
        "--max-num-seqs",
        type=int,
        default=d.engine.max_num_seqs,
        help="engine slots (default: %(default)s)",
    )
    add(
        "--kv-capacity-tokens",
        type=int,
        default=d.engine.kv_capacity_tokens,
        help="KV-cache tokens per replica (default: %(default)s)",
    )
    add(
        "--prompt-tokens",
        type=int,
        default=d.engine.prompt_tokens,
        help="prompt tokens per request (default: %(default)s)",
    )
    add(
        "--output-tokens",
        type=int,
        default=d.engine.output_tokens,
        help="output tokens per request (default: %(default)s)",
    )
    add(
        "--target-utilization",
        type=float,
        default=d.target_utilization,
        help="P: target_rate_per_replica as a share of the replica's capacity (default: "
        "%(default)s)",
    )
    add(
        "--backlog-drain-s",
        type=float,
        default=d.backlog_drain_s,
        help="P: the gateway's backlog_drain_s (default: %(default)s)",
    )
    add(
        "--rate-window-s",
        type=float,
        default=d.rate_window_s,
        help="P: the gateway's rate_window_s (default: %(default)s, the schema's)",
    )
    add(
        "--strategies",
        default=",".join(d.strategies),
        help=f"subset of {','.join(STRATEGY_KEYS)} (default: %(default)s)",
    )
    add(
        "--scenarios",
        default=",".join(d.scenarios),
        help="subset of step,ramp (default: %(default)s)",
    )
    add("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> ScalingConfig:
    """The configuration the arguments ask for; ValueError when they make no sense."""
    chosen = tuple(dict.fromkeys(k.strip().upper() for k in args.strategies.split(",")))
    scenarios = tuple(dict.fromkeys(k.strip().lower() for k in args.scenarios.split(",")))
    if not chosen or any(k not in STRATEGY_KEYS for k in chosen):
        raise ValueError(f"--strategies takes a subset of {','.join(STRATEGY_KEYS)}")
    if not scenarios or any(k not in ("step", "ramp") for k in scenarios):
        raise ValueError("--scenarios takes a subset of step,ramp")
    if args.cold_start_s < 0 or args.scrape_interval_s < 1 or args.hpa_sync_s < 1:
        raise ValueError("--cold-start-s must be >= 0, the intervals >= 1 s")
    if args.hpa_scale_down_window_s < 0 or args.queue_hpa_scale_down_window_s < 0:
        raise ValueError("the HPA scale-down windows must be >= 0")
    if args.base_rate <= 0 or args.factor <= 0:
        raise ValueError("--base-rate and --factor must be positive")
    if args.output_tokens < 2 or args.prompt_tokens < 1 or args.max_num_seqs < 1:
        raise ValueError("--output-tokens must be >= 2, --prompt-tokens and --max-num-seqs >= 1")
    if args.inflight_limit is not None and args.inflight_limit < 1:
        raise ValueError("--inflight-limit must be >= 1")
    if not 0 < args.target_utilization <= 1:
        raise ValueError("--target-utilization must be in (0, 1]")
    if args.backlog_drain_s <= 0 or args.rate_window_s <= 0:
        raise ValueError("--backlog-drain-s and --rate-window-s must be > 0")
    defaults = ScalingConfig()
    engine = replace(
        defaults.engine,
        max_num_seqs=args.max_num_seqs,
        kv_capacity_tokens=args.kv_capacity_tokens,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    if engine.kv_capacity_tokens < engine.tokens_per_request:
        raise ValueError("--kv-capacity-tokens must hold at least one request")
    return replace(
        defaults,
        seed=args.seed,
        cold_start_s=args.cold_start_s,
        scrape_interval_s=args.scrape_interval_s,
        hpa_sync_s=args.hpa_sync_s,
        hpa_phase_s=args.hpa_sync_s / 2,
        hpa_scale_down_window_s=args.hpa_scale_down_window_s,
        queue_hpa_scale_down_window_s=args.queue_hpa_scale_down_window_s,
        base_rate=args.base_rate,
        factor=args.factor,
        inflight_limit=args.inflight_limit,
        engine=engine,
        settings=baseline_settings(defaults.settings, engine, args.base_rate),
        target_utilization=args.target_utilization,
        backlog_drain_s=args.backlog_drain_s,
        rate_window_s=args.rate_window_s,
        strategies=chosen,
        scenarios=scenarios,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``llm-gateway bench scaling``; 0 on success, 2 on bad arguments."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_scaling(config, progress=not args.no_progress)
    sys.stdout.write(format_report(result))
    sys.stdout.flush()
    if not args.no_out:
        for outcome in result.scenarios:
            path = args.out / f"scaling-{outcome.scenario.name}.png"
            plot(outcome, path, config)
            print(f"wrote {path}", file=sys.stderr)
    return 0
