"""``llm-gateway bench priority``: priority classes under overload.

Four slowed simulated replicas, each with a bound on requests in flight
(`max_inflight_per_replica`), behind the gateway; open-loop Poisson arrivals at ``--load`` x
the fleet's capacity for ``--seconds``. The same arrivals run twice: once with no priority
(every request waits in the gateway's queue, first come first served), once with every other
request (by a seeded draw) `x-gateway-priority: 1` and the rest sheddable (`-1`). Per class:
requests, served, shed (429 with Retry-After), timed out in the queue (503), TTFT p50 and p90
of the served, and goodput (first token within ``--objective-s``, per second of arrivals).
Writes ``--out`` (docs/priority.md) unless ``--no-out``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import uvloop

from bench.compare.code_state import code_revision
from bench.driver import RequestResult, percentile, send
from bench.launcher import start_gateway
from bench.workloads_overload import Phase, phase_arrivals
from gateway import headers
from gateway.cli_types import positive_float
from replica.processes import start_sim_replicas

MODEL = "sim-model"
REPLICAS = 4
SLOTS = 2
"""max_inflight_per_replica: the slots each replica offers the gateway."""
SLOWED = {"prefill_s_per_token": 0.0002, "decode_step_s": 0.02}
MAX_TOKENS = 16
SERVICE_S = 0.4
"""About one request's time on a slot here (a ~150-token prompt, 16 tokens at 20 ms a step
in a batch of two): the fleet serves REPLICAS x SLOTS / SERVICE_S requests a second."""
QUEUE_TIMEOUT_S = 5.0
CLASSES = {"high": 1, "sheddable": -1}


@dataclass(frozen=True, slots=True)
class Row:
    run: str
    kind: str
    results: tuple[RequestResult, ...]

    def figures(self, objective_s: float, seconds: float) -> list[str]:
        rs = self.results
        served = [r for r in rs if r.ok]
        ttfts = sorted(r.ttft_s for r in served if r.ttft_s is not None)
        good = sum(1 for t in ttfts if t <= objective_s)
        shed = sum(1 for r in rs if r.status == 429)
        late = sum(1 for r in rs if r.status == 503)
        p50 = f"{1000 * percentile(ttfts, 50):.0f}" if ttfts else "-"
        p90 = f"{1000 * percentile(ttfts, 90):.0f}" if ttfts else "-"
        return [self.run, self.kind, str(len(rs)), str(len(served)), str(shed), str(late),
                p50, p90, f"{good / seconds:.2f}"]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--load", type=positive_float, default=1.5, help="x capacity (default 1.5)")
    parser.add_argument(
        "--seconds", type=positive_float, default=40.0, help="of arrivals (default 40)"
    )
    parser.add_argument(
        "--objective-s", type=positive_float, default=2.0, help="goodput's TTFT bound"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/priority.md"))
    parser.add_argument("--no-out", action="store_true", help="print only")


async def _replay(url: str, arrivals: list[float], kinds: list[str] | None) -> list[RequestResult]:
    body_of = [
        f'{{"model": "{MODEL}", "stream": true, "max_tokens": {MAX_TOKENS}, "messages": '
        f'[{{"role": "user", "content": "Request {i}: {"say more " * 60}"}}]}}'.encode()
        for i in range(len(arrivals))
    ]
    timeout = aiohttp.ClientTimeout(total=QUEUE_TIMEOUT_S + 60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()

        async def one(i: int) -> RequestResult:
            await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
            extra = {headers.PRIORITY: str(CLASSES[kinds[i]])} if kinds is not None else None
            result, _ = await send(session, url, body_of[i], stream=True, extra_headers=extra)
            return result

        return list(await asyncio.gather(*(one(i) for i in range(len(arrivals)))))


async def measure(args: argparse.Namespace) -> tuple[list[Row], str]:
    capacity = REPLICAS * SLOTS / SERVICE_S
    arrivals = phase_arrivals(capacity, [Phase(args.seconds, args.load)], seed=args.seed)
    draw = random.Random(args.seed)
    kinds = [draw.choice(list(CLASSES)) for _ in arrivals]
    replicas = await start_sim_replicas(REPLICAS, model=MODEL, **SLOWED)
    rows: list[Row] = []
    try:
        policy = {
            "pools": {
                "small": {
                    "model": MODEL,
                    "replicas": [r.url for r in replicas],
                    "max_inflight_per_replica": SLOTS,
                    "queue_timeout_s": QUEUE_TIMEOUT_S,
                }
            }
        }
        for run, with_priority in (("no priority", False), ("priority", True)):
            gateway = await start_gateway(policy)
            try:
                print(f"[priority] {run}: {len(arrivals)} requests...", file=sys.stderr)
                url = f"{gateway.url}/v1/chat/completions"
                results = await _replay(url, arrivals, kinds if with_priority else None)
            finally:
                await gateway.stop()
            for kind in CLASSES:
                chosen = tuple(r for r, k in zip(results, kinds, strict=True) if k == kind)
                rows.append(Row(run, kind, chosen))
            await asyncio.sleep(2 * SERVICE_S)  # the replicas drain
    finally:
        for replica in replicas:
            await replica.stop()
    return rows, f"{capacity:.0f} requests/s"


def report(rows: list[Row], args: argparse.Namespace, capacity: str) -> str:
    command = (
        f"llm-gateway bench priority --load {args.load:g} --seconds {args.seconds:g} "
        f"--objective-s {args.objective_s:g} --seed {args.seed}"
    )
    lines = [
        "# Priority classes under overload",
        "",
        f"`{command}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {code_revision()}. "
        f"{REPLICAS} simulated replicas, "
        f"{SLOTS} requests in flight each (`max_inflight_per_replica`), about {capacity}; "
        f"Poisson arrivals at {args.load:g}x that for {args.seconds:g} s, the same in both "
        f"runs; the gateway queues up to {QUEUE_TIMEOUT_S:g} s. `priority`: each request "
        "drawn `x-gateway-priority: 1` (high) or `-1` (sheddable); `no priority`: the same "
        f"requests with no header. Goodput: first token within {args.objective_s:g} s, per "
        "second of arrivals.",
        "",
        "| run | requests of | sent | served | shed (429) | queue timeout (503) | "
        "TTFT p50 ms | TTFT p90 ms | goodput (req/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(row.figures(args.objective_s, args.seconds)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if not args.no_out:  # before the run, not after: a bad path fails at once
        args.out.parent.mkdir(parents=True, exist_ok=True)
    rows, capacity = uvloop.run(measure(args))
    text = report(rows, args, capacity)
    sys.stdout.write(text)
    if not args.no_out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
