"""``llm-gateway bench overhead``: what the gateway adds on top of a replica that costs nothing.

One zero-delay simulated replica (every sim timing 0) and a round-robin gateway in front of it.
The same small chat request is sent straight to the replica and through the gateway in the same
run, in alternating batches (direct/gateway, then gateway/direct, ...) so that machine noise and
warm-up land on both sides alike. Non-streaming and streaming, at the chosen concurrency and at
concurrency 1 (where latency is the gateway's own cost, not queueing behind other requests).

Client, gateway and replica share this machine's cores: at high concurrency the gateway's
figures include competing with the other two for CPU, as a sidecar on a busy node would.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench.driver import RequestResult, percentile, run_plain
from gateway.launcher import start_gateway
from replica.processes import ManagedProcess, start_sim_replicas

MODEL = "sim-model"
_ZERO_DELAY = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
_TARGETS = ("direct", "gateway")


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    requests: int = 4000
    """Measured requests per target, mode and concurrency level, split over the rounds."""
    concurrency: int = 32
    rounds: int = 8
    unloaded_requests: int = 500
    """Measured requests per target and mode at concurrency 1 (0 leaves that pass out)."""
    max_tokens: int = 16
    timeout_s: float = 30.0
    out: Path | None = Path("docs/overhead.md")

    def command(self) -> str:
        """The command line that reproduces this run, every option spelled out."""
        parts = [
            "llm-gateway bench overhead",
            f"--requests {self.requests}",
            f"--concurrency {self.concurrency}",
            f"--rounds {self.rounds}",
            f"--unloaded-requests {self.unloaded_requests}",
            f"--max-tokens {self.max_tokens}",
        ]
        parts.append(f"--out {self.out}" if self.out is not None else "--no-out")
        return " ".join(parts)

    def body(self) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": self.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class Side:
    """Every measured request to one target in one cell, and the time they took."""

    results: tuple[RequestResult, ...]
    wall_s: float

    @property
    def req_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s else 0.0

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    def latency_ms(self, q: float) -> float:
        return 1000 * percentile([r.latency_s for r in self.results if r.ok], q)

    def ttft_ms(self, q: float) -> float:
        ttfts = [r.ttft_s for r in self.results if r.ok and r.ttft_s is not None]
        return 1000 * percentile(ttfts, q)


@dataclass(frozen=True, slots=True)
class Cell:
    """One mode (streaming or not) at one concurrency: both targets."""

    stream: bool
    concurrency: int
    direct: Side
    gateway: Side


@dataclass(frozen=True, slots=True)
class OverheadResult:
    config: OverheadConfig
    cells: tuple[Cell, ...]
    started: datetime
    machine: str


def machine_description() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = (line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name"))
            model = next(names, "").strip()
    except OSError:
        pass  # not Linux: the core count and platform still say enough
    cores = os.cpu_count() or 0
    cpu = f"{cores} cores" + (f" ({model})" if model else "")
    return f"{cpu}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


async def _cell(
    urls: dict[str, str],
    body: dict[str, Any],
    *,
    stream: bool,
    concurrency: int,
    total: int,
    rounds: int,
    timeout_s: float,
) -> Cell:
    results: dict[str, list[RequestResult]] = {target: [] for target in _TARGETS}
    walls = dict.fromkeys(_TARGETS, 0.0)
    # Unmeasured warm-up: connections, caches and allocator pools on both paths.
    for target in _TARGETS:
        await run_plain(
            urls[target],
            body,
            requests=2 * concurrency,
            concurrency=concurrency,
            stream=stream,
            timeout_s=timeout_s,
        )
    per_round = [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]
    for i, count in enumerate(per_round):
        # Alternate who goes first, so neither side always runs right after the other.
        order = _TARGETS if i % 2 == 0 else _TARGETS[::-1]
        for target in order:
            run = await run_plain(
                urls[target],
                body,
                requests=count,
                concurrency=concurrency,
                stream=stream,
                timeout_s=timeout_s,
            )
            results[target] += run.results
            walls[target] += run.wall_s
    direct, gateway = (Side(tuple(results[t]), walls[t]) for t in _TARGETS)
    return Cell(stream, concurrency, direct, gateway)


async def run_overhead(config: OverheadConfig) -> OverheadResult:
    """Start the zero-delay replica and the gateway, measure every cell, stop both."""
    started = datetime.now(UTC)
    processes: list[ManagedProcess] = []
    try:
        replicas = await start_sim_replicas(1, model=MODEL, **_ZERO_DELAY)
        processes += replicas
        policy = {
            "pools": {
                "bench": {"model": MODEL, "replicas": [replicas[0].url], "policy": "round-robin"}
            }
        }
        gateway = await start_gateway(policy)
        processes.append(gateway)
        urls = {"direct": replicas[0].url, "gateway": gateway.url}
        plan = [(config.concurrency, config.requests)]
        if config.unloaded_requests and config.concurrency != 1:
            plan.append((1, config.unloaded_requests))
        cells = []
        for stream in (False, True):
            for concurrency, total in plan:
                cells.append(
                    await _cell(
                        urls,
                        config.body(),
                        stream=stream,
                        concurrency=concurrency,
                        total=total,
                        rounds=config.rounds,
                        timeout_s=config.timeout_s,
                    )
                )
    finally:
        # Shielded: after Ctrl-C cancels this task, the children must still be stopped.
        await asyncio.shield(asyncio.gather(*(p.stop() for p in processes), return_exceptions=True))
    return OverheadResult(config, tuple(cells), started, machine_description())


def _f(value: float, sign: str = "") -> str:
    # NaN: nothing was measured (every request failed).
    return "-" if math.isnan(value) else f"{value:{sign}.2f}"


def format_table(result: OverheadResult) -> str:
    """A markdown table: both targets per cell, then the gateway against direct."""
    lines = [
        "| mode | concurrency | target | req/s | p50 ms | p99 ms | TTFT p50 ms | failed |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for cell in result.cells:
        mode = "streaming" if cell.stream else "non-streaming"
        for target, side in (("direct", cell.direct), ("gateway", cell.gateway)):
            ttft = _f(side.ttft_ms(50)) if cell.stream else ""
            lines.append(
                f"| {mode} | {cell.concurrency} | {target} | {side.req_per_s:.0f} | "
                f"{_f(side.latency_ms(50))} | {_f(side.latency_ms(99))} | {ttft} | "
                f"{side.failed} |"
            )
        d, g = cell.direct, cell.gateway
        ratio = g.req_per_s / d.req_per_s if d.req_per_s else math.nan
        added_ttft = _f(g.ttft_ms(50) - d.ttft_ms(50), "+") if cell.stream else ""
        lines.append(
            f"| {mode} | {cell.concurrency} | **gateway vs direct** | {_f(ratio)}x | "
            f"{_f(g.latency_ms(50) - d.latency_ms(50), '+')} | "
            f"{_f(g.latency_ms(99) - d.latency_ms(99), '+')} | {added_ttft} | |"
        )
    return "\n".join(lines) + "\n"


def format_report(result: OverheadResult) -> str:
    """The markdown file: how to reproduce the run, where it ran, and the table."""
    config = result.config
    method = (
        "One zero-delay simulated replica (every sim timing 0) and the gateway in front of it "
        "(one pool, one replica, round-robin). The same chat request "
        f"(max_tokens {config.max_tokens}) is sent straight to the replica and through the "
        f"gateway in the same run: {config.rounds} batches per side and cell, alternating "
        "which side goes first, after an unmeasured warm-up. Closed loop, one aiohttp client "
        "session per batch. Latency is per request, from sending it to the end of the body; "
        "TTFT is the time to the first content delta. The added milliseconds are gateway "
        "minus direct at the same percentile."
    )
    caveat = (
        "Client, gateway and replica all run on this machine and share its cores, so at high "
        "concurrency the gateway's figures include CPU contention with the other two; "
        "concurrency 1 shows the gateway's own per-request cost."
    )
    lines = [
        "# Gateway overhead",
        "",
        method,
        "",
        caveat,
        "",
        f"- Command: `{config.command()}`",
        f"- Date: {result.started:%Y-%m-%d %H:%M} UTC",
        f"- Machine: {result.machine}",
        "",
        format_table(result),
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = OverheadConfig()
    parser.add_argument(
        "--requests",
        type=int,
        default=defaults.requests,
        help="measured requests per side, mode and concurrency (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=defaults.concurrency,
        help="requests in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help="alternating direct/gateway batches per cell (default: %(default)s)",
    )
    parser.add_argument(
        "--unloaded-requests",
        type=int,
        default=defaults.unloaded_requests,
        help="measured requests per side and mode at concurrency 1; 0 skips that pass "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        help="completion tokens per request (default: %(default)s)",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--out",
        type=Path,
        default=defaults.out,
        help="markdown report to write (default: %(default)s)",
    )
    out.add_argument("--no-out", action="store_true", help="print only, write no file")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``llm-gateway bench overhead``; 0 when every request succeeded."""
    if min(args.requests, args.concurrency, args.rounds) < 1 or args.unloaded_requests < 0:
        print("error: --requests, --concurrency and --rounds must be at least 1", file=sys.stderr)
        return 2
    config = OverheadConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        rounds=args.rounds,
        unloaded_requests=args.unloaded_requests,
        max_tokens=args.max_tokens,
        out=None if args.no_out else args.out,
    )
    print("Starting a zero-delay simulated replica and the gateway...", file=sys.stderr)
    try:
        result = uvloop.run(run_overhead(config))
    except KeyboardInterrupt:
        return 130
    report = format_report(result)
    sys.stdout.write(report)
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(report, encoding="utf-8")
        print(f"\nwrote {config.out}", file=sys.stderr)
    failed = sum(side.failed for cell in result.cells for side in (cell.direct, cell.gateway))
    return 0 if failed == 0 else 1
