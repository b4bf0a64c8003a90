"""The markdown report of ``bench overhead``: the figures, and each router against direct and
against this gateway."""

from __future__ import annotations

import math

from bench import peers
from bench.overhead.config import (
    CACHE_AWARE_PEERS,
    DIRECT,
    GATEWAY,
    NOTES_MARKER,
    PEER_POLICY,
    PEERS,
    PREFIX_AWARE,
    OverheadResult,
    Side,
    Target,
)


def fmt(value: float, sign: str = "", digits: int = 2) -> str:
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
            ttft = f"{fmt(side.ttft_ms(50))} | {fmt(side.ttft_ms(99))}" if cell.stream else " | "
            router_cpu = (
                "" if target.pid is None else fmt(side.cpu_us_per_request(side.router_cpu_s), "", 0)
            )
            lines.append(
                f"{prefix} {fmt(side.req_per_s, '', 0)} | {fmt(side.latency_ms(50))} | "
                f"{fmt(side.latency_ms(99))} | {ttft} | {router_cpu} | "
                f"{fmt(side.cpu_us_per_request(side.replica_cpu_s), '', 0)} | {side.failed} |"
            )
    return "\n".join(lines) + "\n"


def _against(side: Side, reference: Side | None, stream: bool) -> list[str]:
    """req/s ratio and the added p50, p99 and TTFT p50 (ms) of ``side`` over ``reference``."""
    if reference is None:
        return ["-"] * (4 if stream else 3)
    cells = [
        _x(ratio(side.req_per_s, reference.req_per_s)),
        fmt(side.latency_ms(50) - reference.latency_ms(50), "+"),
        fmt(side.latency_ms(99) - reference.latency_ms(99), "+"),
    ]
    if stream:
        cells.append(fmt(side.ttft_ms(50) - reference.ttft_ms(50), "+"))
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
        "this gateway (one pool, one replica, round-robin), the gateway with its features on "
        "(two prefix-aware pools behind a tier model with the learned classifier, a tenant "
        "with request and token limits, shared state through Redis; its requests name the "
        "tier model and carry the tenant's key) and, when installed, the peer "
        "routers vllm-router and sglang-router (`--policy round_robin`, one worker), the "
        "routing users run (this gateway prefix-aware, its default policy, and the peers "
        "with `--policy cache_aware`), and the Python floor: a bare relay on the gateway's "
        "loop and parser with nothing else in it (bench/overhead/floor.py), whose cost any "
        "Python router pays, so that the gateway's figure less the floor's is the gateway's "
        "own work. "
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
    peer_targets = [t for t in result.targets if t.name in PEERS + CACHE_AWARE_PEERS]
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
    if any(t.name == PREFIX_AWARE and t.measured for t in result.targets):
        lines += ["## The routing users run", "", ROUTING_METHOD, "", format_routing(result)]
    if result.chunks is not None:
        lines += ["## CPU per relayed chunk", "", CHUNK_METHOD, "", format_chunks(result)]
    return "\n".join(lines)


CHUNK_METHOD = (
    "A second replica paces its tokens (one every 2 ms, each its own write, so each reaches "
    "the router as a chunk of its own); the gateway and the peers are started anew in front "
    "of it. Streamed requests of few tokens and of many go through each at the same "
    "concurrency, interleaved as above; a router's CPU per chunk is what a request of many "
    "chunks costs it beyond one of few, divided by the chunks more (counted from the answers' "
    "usage)."
)


ROUTING_METHOD = (
    "Each router with the routing its users run, on the same replica and requests: this "
    "gateway prefix-aware (its default: the prompt fingerprinted, its index matched and the "
    "dispatch recorded on every request) against the peers' cache_aware policy (their "
    "radix tree of prompts). Router CPU per request, and the gateway's over each peer's."
)


def format_routing(result: OverheadResult) -> str:
    """Per cell, the CPU per request of the gateway prefix-aware against each peer's
    cache_aware, and their ratio."""
    header = " | ".join(CACHE_AWARE_PEERS)
    ratios = " | ".join(f"{PREFIX_AWARE} / {p}" for p in CACHE_AWARE_PEERS)
    lines = [
        f"| mode | concurrency | {PREFIX_AWARE} | {header} | {ratios} |",
        "|---|---:|" + "---:|" * (1 + 2 * len(CACHE_AWARE_PEERS)),
    ]
    for cell in result.cells:
        ours = _cpu(cell.sides.get(PREFIX_AWARE))
        theirs = [_cpu(cell.sides.get(p)) for p in CACHE_AWARE_PEERS]
        figures = [fmt(v, "", 0) for v in (ours, *theirs)] + [_x(ratio(ours, t)) for t in theirs]
        lines.append(f"| {cell.mode} | {cell.concurrency} | " + " | ".join(figures) + " |")
    return "\n".join(lines) + "\n"


def _cpu(side: Side | None) -> float:
    return math.nan if side is None else side.cpu_us_per_request(side.router_cpu_s)


def format_chunks(result: OverheadResult) -> str:
    chunks = result.chunks
    assert chunks is not None
    lines = [
        "| router | tokens per request | CPU us/req, few | CPU us/req, many | CPU us per chunk |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, many in chunks.many.sides.items():
        few = chunks.few.sides.get(name)
        if name == DIRECT or few is None:
            continue
        lines.append(
            f"| {name} | {few.mean_output_tokens:.0f} / {many.mean_output_tokens:.0f} | "
            f"{fmt(few.cpu_us_per_request(few.router_cpu_s), '', 0)} | "
            f"{fmt(many.cpu_us_per_request(many.router_cpu_s), '', 0)} | "
            f"{fmt(chunks.cpu_us_per_chunk(name), '', 1)} |"
        )
    return "\n".join(lines) + "\n"


def _peer_line(target: Target) -> str:
    if not target.status:
        peer, _, policy = target.name.partition(" ")
        version = peers.VERSIONS.get(peer)
        return f"{peer} {version} measured (--policy {policy or PEER_POLICY})"
    return f"{target.name}: {target.status}" + (f" ({target.detail})" if target.detail else "")


def keep_notes(report: str, previous: str | None) -> str:
    """``report`` followed by the hand-written notes of ``previous`` (what follows its
    NOTES_MARKER line), or by an empty marker when there were none."""
    notes = ""
    if previous is not None and NOTES_MARKER in previous:
        notes = previous.split(NOTES_MARKER, 1)[1]
    return report.rstrip("\n") + "\n\n" + NOTES_MARKER + (notes or "\n")
