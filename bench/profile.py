"""``llm-gateway bench profile``: where the gateway's CPU goes per request, sampled by py-spy.

One zero-delay simulated replica and the gateway in front of it (round-robin, as ``bench
overhead``'s bare gateway). py-spy samples the gateway's process, without pausing it, while a
closed loop of requests runs: non-streaming, then streaming. A sample counts for the part of
the request path (``PARTS``) of its innermost frame that is in one, and each part's share of
the samples, times the process's CPU per request read around the load, is what that part costs
per request. The flame graph of both runs goes to ``--out`` (a PNG).

Sampled profiles attribute time to Python frames: time in C (the event loop, system calls)
shows under the Python frame that called it, and what no Python frame calls (the loop's own
polling and socket reads) under "event loop and system calls".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench.driver import run_plain
from bench.flame import above_loop, draw
from bench.host import process_cpu_s
from bench.launcher import start_gateway
from bench.overhead.config import MODEL, ZERO_DELAY, OverheadConfig
from bench.overhead.runner import one_pool
from gateway.cli_types import positive_int
from replica.processes import ManagedProcess, start_sim_replicas

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("client side: front", ("gateway/http/front.py",)),
    # aiohttp's writer and parser serve its client and server alike: their frames count for
    # the frame that called them.
    ("client side: aiohttp", ("aiohttp/web_",)),
    ("replica side", ("gateway/relay/upstream.py", "aiohttp/client", "aiohttp/connector")),
    ("metrics and logs", ("prometheus_client/", "gateway/telemetry/metrics.py", "logging/")),
    (
        "parsing and routing",
        (
            "gateway/http/request_body.py", "gateway/routing/resolve.py", "gateway/fleet/pools.py",
            "gateway/fleet/replicas.py", "gateway/routing/affinity.py", "router_policies/",
            "gateway/rate_limit/", "orjson",
        ),
    ),
    (
        "forwarding",
        (
            "gateway/relay/proxy.py", "gateway/relay/answers.py", "gateway/http/completions.py",
            "gateway/relay/usage.py", "gateway/fleet/outlier.py", "gateway/http/exchange.py",
        ),
    ),
    ("asyncio: tasks, futures, timeouts", ("asyncio/",)),
)  # fmt: skip
"""The parts of the request path, each by the source paths of its frames; a sample belongs to
the first part (in this order) that one of its frames, innermost first, belongs to."""
LOOP = "event loop and system calls"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=positive_int, default=10000, help="requests per mode")
    parser.add_argument("--concurrency", type=positive_int, default=32)
    parser.add_argument("--rate", type=positive_int, default=500, help="py-spy samples per second")
    parser.add_argument(
        "--out", type=Path, default=Path("docs/overhead-profile.png"), help="flame graph PNG"
    )


@dataclass(frozen=True, slots=True)
class Profile:
    """One mode's samples (collapsed stacks, outermost frame first) and the CPU per request."""

    mode: str
    stacks: Mapping[tuple[str, ...], int]
    cpu_us_per_request: float

    def parts(self) -> dict[str, float]:
        """Each part's share of the samples."""
        counts: Counter[str] = Counter()
        for stack, samples in self.stacks.items():
            counts[part_of(stack)] += samples
        total = sum(counts.values()) or 1
        return {name: counts[name] / total for name in (*(p for p, _ in PARTS), LOOP)}


def part_of(stack: Iterable[str]) -> str:
    """The part of the innermost frame that belongs to one, above the event loop's run."""
    for frame in reversed(above_loop(stack)):
        for name, paths in PARTS:
            if any(path in frame for path in paths):
                return name
    return LOOP


def parse_raw(text: str) -> dict[tuple[str, ...], int]:
    """py-spy's raw output: one collapsed stack per line, ``outer;...;inner COUNT``."""
    stacks: dict[tuple[str, ...], int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            key = tuple(stack.split(";"))
            stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


async def _sample(py_spy: str, pid: int, rate: int, out: Path) -> asyncio.subprocess.Process:
    argv = [py_spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking"]
    argv += ["--format", "raw", "--output", str(out)]
    return await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )


async def _profile(args: argparse.Namespace, py_spy: str, folder: Path) -> list[Profile]:
    processes: list[ManagedProcess] = []
    profiles = []
    try:
        [replica] = await start_sim_replicas(1, model=MODEL, **ZERO_DELAY)
        processes.append(replica)
        gateway = await start_gateway(one_pool(replica.url))
        processes.append(gateway)
        body = OverheadConfig().body()
        for stream in (False, True):
            mode = "streaming" if stream else "non-streaming"
            warm = 4 * args.concurrency
            await run_plain(gateway.url, body, requests=warm, concurrency=args.concurrency,
                            stream=stream)  # fmt: skip
            out = folder / f"{mode}.txt"
            sampler = await _sample(py_spy, gateway.pid, args.rate, out)
            before = process_cpu_s(gateway.pid)
            run = await run_plain(
                gateway.url, body, requests=args.requests, concurrency=args.concurrency,
                stream=stream, progress=True, description=mode,
            )  # fmt: skip
            after = process_cpu_s(gateway.pid)
            sampler.send_signal(signal.SIGINT)
            _, err = await sampler.communicate()
            if not out.exists():
                said = err.decode().strip()[-300:] or "it said nothing"
                raise RuntimeError(f"py-spy wrote no profile: {said}")
            failed = sum(1 for r in run.results if not r.ok)
            if failed:
                raise RuntimeError(f"{failed} of the profiled requests failed")
            cpu = 1e6 * (after - before) / args.requests if before and after else float("nan")
            profiles.append(Profile(mode, parse_raw(out.read_text()), cpu))
    finally:
        await asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
    return profiles


def summary(profiles: list[Profile]) -> str:
    lines = ["| part of the request path | " + " | ".join(p.mode for p in profiles) + " |"]
    lines.append("|---|" + "---:|" * len(profiles))
    shares = [p.parts() for p in profiles]
    for name in shares[0]:
        cells = [
            f"{share[name]:.0%} ({share[name] * p.cpu_us_per_request:.0f} us)"
            for share, p in zip(shares, profiles, strict=True)
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    totals = [f"{p.cpu_us_per_request:.0f} us" for p in profiles]
    lines.append("| gateway CPU per request | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(py_spy, os.X_OK):
        print("error: py-spy is not installed: pip install 'llm-gateway[bench]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        try:
            profiles = uvloop.run(_profile(args, py_spy, Path(folder)))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    sys.stdout.write(summary(profiles))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    parts = [name for name, _ in PARTS] + [LOOP]
    draw([(p.mode, p.stacks) for p in profiles], args.out, parts, part_of)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
