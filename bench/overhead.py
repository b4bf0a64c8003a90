"""``llm-gateway bench overhead``: what a router adds on top of a replica that costs nothing.

One zero-delay simulated replica (every sim timing 0) and, in front of that same replica, this
gateway (round-robin) and, when installed, the peer routers vllm-router and sglang-router
(``--policy round_robin``). The same small chat request is sent straight to the replica and
through each router in the same run, in batches interleaved across targets: the order rotates
every round (direct, gateway, vllm, sglang; then gateway, vllm, sglang, direct; ...) so that
machine noise and warm-up land on every target alike. Non-streaming and streaming, at the
chosen concurrency and at concurrency 1 (where latency is the router's own cost, not queueing
behind other requests; it is also where a keep-alive stall on a streamed response shows).

Besides latency and throughput, each router's CPU time per request is read from the kernel
(/proc/PID/task/*/schedstat) around its own batches only, and so is the replica's.

Client, routers and replica share this machine's cores: at high concurrency a router's
figures include competing with the client and the replica for CPU, as a sidecar on a busy
node would.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench import peers
from bench.driver import RequestResult, RunResult, percentile, run_plain
from bench.launcher import start_gateway
from replica.processes import ManagedProcess, start_sim_replicas

MODEL = "sim-model"
_ZERO_DELAY = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
DIRECT = "direct"
GATEWAY = "gateway"
PEERS: tuple[peers.PeerKind, ...] = ("vllm-router", "sglang-router")
PEER_POLICY = "round_robin"
TARGETS = (DIRECT, GATEWAY, *PEERS)
NOTES_MARKER = "<!-- Hand-written notes below this line are kept when the benchmark rewrites -->"
"""Everything after this line in an existing report survives a rerun (the reading of the
figures is written by a person, not generated)."""


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    requests: int = 8000
    """Measured requests per target, mode and concurrency level, split over the rounds."""
    concurrency: int = 32
    rounds: int = 8
    unloaded_requests: int = 1000
    """Measured requests per target and mode at concurrency 1 (0 leaves that pass out)."""
    max_tokens: int = 16
    timeout_s: float = 30.0
    peers: bool = True
    """Also measure vllm-router and sglang-router when they are installed."""
    peers_venv: Path | None = None
    """Where the peers' virtualenv is; None: bench.peers' default ($PEERS_VENV or
    .cache/peers-venv)."""
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
        if not self.peers:
            parts.append("--no-peers")
        elif self.peers_venv is not None:
            parts.append(f"--peers-venv {self.peers_venv}")
        parts.append(f"--out {self.out}" if self.out is not None else "--no-out")
        return " ".join(parts)

    def body(self) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": self.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class Target:
    """One thing requests are sent to, or why it was not measured."""

    name: str
    url: str | None = None
    pid: int | None = None
    """The router's process (its CPU time is read around its batches); None for direct."""
    status: str = ""
    """Empty when measured; otherwise what the table shows instead of figures."""
    detail: str = ""
    """Why it was not measured, at more length (the report's list of peers)."""

    @property
    def measured(self) -> bool:
        return self.url is not None


@dataclass(frozen=True, slots=True)
class Side:
    """Every measured request to one target in one cell, the time and CPU they took."""

    results: tuple[RequestResult, ...]
    wall_s: float
    router_cpu_s: float | None = None
    """CPU the router process used during this target's batches; None when not read."""
    replica_cpu_s: float | None = None

    @property
    def req_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s else math.nan

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    def latency_ms(self, q: float) -> float:
        return 1000 * percentile([r.latency_s for r in self.results if r.ok], q)

    def ttft_ms(self, q: float) -> float:
        ttfts = [r.ttft_s for r in self.results if r.ok and r.ttft_s is not None]
        return 1000 * percentile(ttfts, q)

    def cpu_us_per_request(self, cpu_s: float | None) -> float:
        if cpu_s is None or not self.results:
            return math.nan
        return 1e6 * cpu_s / len(self.results)


@dataclass(frozen=True, slots=True)
class Cell:
    """One mode (streaming or not) at one concurrency: every measured target."""

    stream: bool
    concurrency: int
    sides: Mapping[str, Side] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "streaming" if self.stream else "non-streaming"


@dataclass(frozen=True, slots=True)
class OverheadResult:
    config: OverheadConfig
    targets: tuple[Target, ...]
    cells: tuple[Cell, ...]
    started: datetime
    machine: str

    @property
    def failed(self) -> int:
        return sum(side.failed for cell in self.cells for side in cell.sides.values())


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


def round_order(names: Sequence[str], round_index: int) -> tuple[str, ...]:
    """The targets' order in one round: rotated by one place per round, so each target takes
    every position equally often over ``len(names)`` rounds."""
    if not names:
        return ()
    shift = round_index % len(names)
    return (*names[shift:], *names[:shift])


def split_requests(total: int, rounds: int) -> list[int]:
    """``total`` requests over ``rounds`` batches, as even as whole numbers allow."""
    return [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for parent in found:  # grows while iterated: a breadth-first walk of the process tree
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                found += [int(child) for child in children.read_text().split()]
            except OSError:
                continue  # the thread ended while being read
    return found


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds run so far by every live thread of ``pid`` and its descendants, at
    nanosecond resolution (``utime`` in /proc/PID/stat counts 10 ms ticks, too coarse for a
    batch of a few hundred requests). None where /proc has no schedstat (not Linux).

    The time of a thread that exited between two readings is lost: the routers measured here
    keep their worker threads for the whole run.
    """
    if pid is None:
        return None
    total_ns = 0
    seen = False
    for process in _descendants(pid):
        for schedstat in Path(f"/proc/{process}/task").glob("*/schedstat"):
            try:
                total_ns += int(schedstat.read_text().split()[0])
                seen = True
            except (OSError, ValueError, IndexError):
                continue
    return total_ns / 1e9 if seen else None


def _add(total: float | None, start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return (total or 0.0) + end - start


async def _cell(
    targets: Sequence[Target],
    replica_pid: int | None,
    body: dict[str, Any],
    *,
    stream: bool,
    concurrency: int,
    total: int,
    rounds: int,
    timeout_s: float,
) -> Cell:
    by_name = {t.name: t for t in targets if t.measured}
    names = tuple(by_name)
    results: dict[str, list[RequestResult]] = {name: [] for name in names}
    walls = dict.fromkeys(names, 0.0)
    router_cpu: dict[str, float | None] = dict.fromkeys(names)
    replica_cpu: dict[str, float | None] = dict.fromkeys(names)

    async def batch(target: Target, requests: int) -> RunResult:
        assert target.url is not None
        return await run_plain(
            target.url,
            body,
            requests=requests,
            concurrency=concurrency,
            stream=stream,
            timeout_s=timeout_s,
        )

    # Unmeasured warm-up: connections, caches and allocator pools on every path.
    for name in names:
        await batch(by_name[name], 2 * concurrency)
    for i, count in enumerate(split_requests(total, rounds)):
        for name in round_order(names, i):
            target = by_name[name]
            router_before, replica_before = process_cpu_s(target.pid), process_cpu_s(replica_pid)
            run = await batch(target, count)
            router_after, replica_after = process_cpu_s(target.pid), process_cpu_s(replica_pid)
            results[name] += run.results
            walls[name] += run.wall_s
            router_cpu[name] = _add(router_cpu[name], router_before, router_after)
            replica_cpu[name] = _add(replica_cpu[name], replica_before, replica_after)
    sides = {
        name: Side(tuple(results[name]), walls[name], router_cpu[name], replica_cpu[name])
        for name in names
    }
    return Cell(stream, concurrency, sides)


async def _start_peers(
    config: OverheadConfig, replica_url: str
) -> list[tuple[Target, ManagedProcess | None]]:
    """Each peer as a target, with its process (None where it was not started)."""
    if not config.peers:
        return [(Target(name, status="skipped (--no-peers)"), None) for name in PEERS]
    # A subprocess checks the venv's versions: off the event loop.
    problem = await asyncio.to_thread(peers.peers_available, config.peers_venv)
    if problem is not None:
        return [(Target(name, status="not installed", detail=problem), None) for name in PEERS]
    started: list[tuple[Target, ManagedProcess | None]] = []
    for name in PEERS:
        try:
            process = await peers.start_peer(
                name, PEER_POLICY, [replica_url], venv=config.peers_venv
            )
        except Exception as exc:
            print(f"warning: {name} did not start: {exc}", file=sys.stderr)
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            started.append((Target(name, status="failed to start", detail=first_line), None))
            continue
        started.append((Target(name, process.url, process.pid), process))
    return started


def _progress(cell: Cell) -> None:
    figures = ", ".join(
        f"{name} {side.req_per_s:.0f} req/s p50 {_f(side.latency_ms(50))} ms"
        for name, side in cell.sides.items()
    )
    print(f"{cell.mode}, concurrency {cell.concurrency}: {figures}", file=sys.stderr)


async def run_overhead(config: OverheadConfig) -> OverheadResult:
    """Start the zero-delay replica and the routers, measure every cell, stop them all."""
    started = datetime.now(UTC)
    processes: list[ManagedProcess] = []
    try:
        replicas = await start_sim_replicas(1, model=MODEL, **_ZERO_DELAY)
        processes += replicas
        replica = replicas[0]
        policy = {
            "pools": {"bench": {"model": MODEL, "replicas": [replica.url], "policy": "round-robin"}}
        }
        gateway = await start_gateway(policy)
        processes.append(gateway)
        targets = [Target(DIRECT, replica.url), Target(GATEWAY, gateway.url, gateway.pid)]
        for target, process in await _start_peers(config, replica.url):
            targets.append(target)
            if process is not None:
                processes.append(process)
        plan = [(config.concurrency, config.requests)]
        if config.unloaded_requests and config.concurrency != 1:
            plan.append((1, config.unloaded_requests))
        cells = []
        for stream in (False, True):
            for concurrency, total in plan:
                cell = await _cell(
                    targets,
                    replica.pid,
                    config.body(),
                    stream=stream,
                    concurrency=concurrency,
                    total=total,
                    rounds=config.rounds,
                    timeout_s=config.timeout_s,
                )
                _progress(cell)
                cells.append(cell)
    finally:
        # Shielded: after Ctrl-C cancels this task, the children must still be stopped.
        await asyncio.shield(asyncio.gather(*(p.stop() for p in processes), return_exceptions=True))
    return OverheadResult(config, tuple(targets), tuple(cells), started, machine_description())


def _f(value: float, sign: str = "", digits: int = 2) -> str:
    # NaN: nothing was measured (every request failed, or no CPU reading).
    return "-" if math.isnan(value) else f"{value:{sign}.{digits}f}"


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN where either is missing or the denominator is 0."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def format_table(result: OverheadResult) -> str:
    """Every target's figures per cell; a target not measured shows why instead."""
    lines = [
        "| mode | concurrency | target | req/s | p50 ms | p99 ms | TTFT p50 ms | TTFT p99 ms "
        "| router CPU us/req | replica CPU us/req | failed |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in result.cells:
        for target in result.targets:
            side = cell.sides.get(target.name)
            prefix = f"| {cell.mode} | {cell.concurrency} | {target.name} |"
            if side is None:
                lines.append(f"{prefix} {target.status or 'not measured'} | | | | | | | |")
                continue
            ttft = f"{_f(side.ttft_ms(50))} | {_f(side.ttft_ms(99))}" if cell.stream else " | "
            router_cpu = (
                "" if target.pid is None else _f(side.cpu_us_per_request(side.router_cpu_s), "", 0)
            )
            lines.append(
                f"{prefix} {_f(side.req_per_s, '', 0)} | {_f(side.latency_ms(50))} | "
                f"{_f(side.latency_ms(99))} | {ttft} | {router_cpu} | "
                f"{_f(side.cpu_us_per_request(side.replica_cpu_s), '', 0)} | {side.failed} |"
            )
    return "\n".join(lines) + "\n"


def _against(side: Side, reference: Side | None, stream: bool) -> list[str]:
    """req/s ratio and the added p50, p99 and TTFT p50 (ms) of ``side`` over ``reference``."""
    if reference is None:
        return ["-"] * (4 if stream else 3)
    cells = [
        _x(ratio(side.req_per_s, reference.req_per_s)),
        _f(side.latency_ms(50) - reference.latency_ms(50), "+"),
        _f(side.latency_ms(99) - reference.latency_ms(99), "+"),
    ]
    if stream:
        cells.append(_f(side.ttft_ms(50) - reference.ttft_ms(50), "+"))
    return cells


def format_comparison(result: OverheadResult) -> str:
    """Each router against direct (what routing costs) and against this gateway."""
    lines = [
        "| mode | concurrency | router | req/s vs direct | +p50 ms | +p99 ms | +TTFT p50 ms "
        "| req/s vs gateway | p50 ms vs gateway | p99 ms vs gateway | TTFT p50 ms vs gateway |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in result.cells:
        direct, gateway = cell.sides.get(DIRECT), cell.sides.get(GATEWAY)
        for name, side in cell.sides.items():
            if name == DIRECT:
                continue
            vs_direct = _against(side, direct, cell.stream)
            vs_gateway = _against(side, None if name == GATEWAY else gateway, cell.stream)
            if not cell.stream:
                vs_direct.append("")
                vs_gateway.append("")
            lines.append(
                f"| {cell.mode} | {cell.concurrency} | {name} | "
                + " | ".join(vs_direct + vs_gateway)
                + " |"
            )
    return "\n".join(lines) + "\n"


def format_report(result: OverheadResult) -> str:
    """The markdown file: how to reproduce the run, where it ran, and the tables."""
    config = result.config
    method = (
        "One zero-delay simulated replica (every sim timing 0). In front of that same replica: "
        "this gateway (one pool, one replica, round-robin) and, when installed, the peer "
        "routers vllm-router and sglang-router (`--policy round_robin`, one worker). "
        "The same chat request "
        f"(max_tokens {config.max_tokens}) is sent straight to the replica (direct) and "
        f"through each router in the same run: {config.rounds} batches per target and cell, "
        "the order of the targets rotated by one place every round, after an unmeasured "
        "warm-up. Closed loop, one aiohttp client session (keep-alive) per batch. Latency is "
        "per request, from sending it to the end of the body; TTFT is the time to the first "
        "content delta. Router and replica CPU are their processes' CPU time (all threads, "
        "from /proc/PID/task/*/schedstat) during that target's batches, per request."
    )
    caveat = (
        "Client, routers and replica all run on this machine and share its cores, so at high "
        "concurrency a router's figures include CPU contention with the client and the "
        "replica; concurrency 1 shows a router's own per-request cost."
    )
    peer_targets = [t for t in result.targets if t.name in PEERS]
    lines = [
        "# Router overhead: this gateway, vllm-router and sglang-router",
        "",
        method,
        "",
        caveat,
        "",
        f"- Command: `{config.command()}`",
        f"- Date: {result.started:%Y-%m-%d %H:%M} UTC",
        f"- Machine: {result.machine}",
        "- Peers: " + "; ".join(_peer_line(t) for t in peer_targets),
        "",
        "## Figures",
        "",
        format_table(result),
        "## Against direct and against this gateway",
        "",
        "req/s ratios are the router's over the reference's; the other columns are the "
        "router's minus the reference's at the same percentile (negative: faster than it).",
        "",
        format_comparison(result),
    ]
    return "\n".join(lines)


def _peer_line(target: Target) -> str:
    if not target.status:
        version = peers.VERSIONS.get(target.name)
        return f"{target.name} {version} measured (--policy {PEER_POLICY})"
    return f"{target.name}: {target.status}" + (f" ({target.detail})" if target.detail else "")


def keep_notes(report: str, previous: str | None) -> str:
    """``report`` followed by the hand-written notes of ``previous`` (what follows its
    NOTES_MARKER line), or by an empty marker when there were none."""
    notes = ""
    if previous is not None and NOTES_MARKER in previous:
        notes = previous.split(NOTES_MARKER, 1)[1]
    return report.rstrip("\n") + "\n\n" + NOTES_MARKER + (notes or "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = OverheadConfig()
    parser.add_argument(
        "--requests",
        type=int,
        default=defaults.requests,
        help="measured requests per target, mode and concurrency (default: %(default)s)",
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
        help="interleaved batches per target and cell (default: %(default)s)",
    )
    parser.add_argument(
        "--unloaded-requests",
        type=int,
        default=defaults.unloaded_requests,
        help="measured requests per target and mode at concurrency 1; 0 skips that pass "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
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
    if min(args.requests, args.concurrency, args.rounds) < 1 or args.unloaded_requests < 0:
        print(
            "error: --requests, --concurrency and --rounds must be at least 1, "
            "--unloaded-requests at least 0",
            file=sys.stderr,
        )
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
    )
    print("Starting a zero-delay simulated replica and the routers...", file=sys.stderr)
    try:
        result = uvloop.run(run_overhead(config))
    except KeyboardInterrupt:
        return 130
    report = format_report(result)
    sys.stdout.write(report)
    if config.out is not None:
        previous = config.out.read_text(encoding="utf-8") if config.out.exists() else None
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(keep_notes(report, previous), encoding="utf-8")
        print(f"\nwrote {config.out}", file=sys.stderr)
    broken = [t.name for t in result.targets if t.status.startswith("failed")]
    return 0 if result.failed == 0 and not broken else 1
