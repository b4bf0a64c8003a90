"""``llm-gateway bench hang``: how soon does ``serve --workers 2`` serve again after one of its
workers stops?

One worker's throughput is measured first (a ``--workers 1`` gateway, the same load). Then a
``--workers 2`` gateway takes the load, and one of its workers is SIGSTOPped: it keeps its
SO_REUSEPORT socket, so until the parent's watchdog kills it (gateway/watchdog.py) the kernel
still hands it a share of new connections, which nobody answers. Clients open a new
connection per request (so the kernel chooses a worker each time) and give up on a request
after ``--client-timeout-s``, as a load balancer's health of one would. Prints the throughput
in half-second bins and the time from the stop until a whole second ran at 80% of one
worker's throughput or more. Zero-delay simulated replicas; bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

import aiohttp
import uvloop

from bench.host import children
from bench.launcher import start_gateway
from gateway.cli_types import positive_float, positive_int
from replica.processes import ManagedProcess, start_sim_replicas

MODEL = "hang-model"
_ZERO_DELAY = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
_BIN_S = 0.5
RECOVERED_SHARE = 0.8
"""Recovered: a whole second at this share of one worker's throughput or more."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--clients", type=positive_int, default=8, help="(default: %(default)s)")
    add("--before-s", type=positive_float, default=3.0, help="(default: %(default)s)")
    add("--after-s", type=positive_float, default=10.0, help="(default: %(default)s)")
    add("--client-timeout-s", type=positive_float, default=1.0, help="(default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    one, bins, stopped_at = uvloop.run(_measure(args))
    print(report(one, bins, stopped_at))
    return 0 if recovery_s(one, bins, stopped_at) is not None else 1


async def _measure(args: argparse.Namespace) -> tuple[float, list[int], float]:
    sims = await start_sim_replicas(2, MODEL, **_ZERO_DELAY)
    policy = {"pools": {"small": {"model": MODEL, "replicas": [s.url for s in sims]}}}
    try:
        single = await start_gateway(policy)
        try:
            done = await _load(single.url, args, args.before_s)
        finally:
            await single.stop()
        one = len(done) / args.before_s
        pair = await start_gateway(policy, env={"GATEWAY_WORKERS": "2"})
        try:
            return one, *await _stop_one(pair, args)
        finally:
            await pair.stop()
    finally:
        await asyncio.gather(*(s.stop() for s in sims))


async def _stop_one(gateway: ManagedProcess, args: argparse.Namespace) -> tuple[list[int], float]:
    """Completions per bin from the start of the load; when (s) the worker was stopped."""
    started = time.monotonic()
    load = asyncio.ensure_future(_load(gateway.url, args, args.before_s + args.after_s))
    await asyncio.sleep(args.before_s)
    assert gateway.pid is not None
    stopped = children(gateway.pid)[0]
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = time.monotonic() - started
    try:
        done = await load
    finally:
        try:
            os.kill(stopped, signal.SIGCONT)  # still there (not replaced): let it stop
        except ProcessLookupError:
            pass
    bins = [0] * int((args.before_s + args.after_s) / _BIN_S + 1)
    for at in done:
        bins[min(int((at - started) / _BIN_S), len(bins) - 1)] += 1
    return bins, stopped_at


async def _load(url: str, args: argparse.Namespace, seconds: float) -> list[float]:
    """When each request completed, over ``seconds`` of ``args.clients`` closed-loop clients."""
    done: list[float] = []
    deadline = time.monotonic() + seconds
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    timeout = aiohttp.ClientTimeout(total=args.client_timeout_s)

    async def client() -> None:
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection per request
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while time.monotonic() < deadline:
                try:
                    async with session.post(f"{url}/v1/chat/completions", json=body) as answer:
                        await answer.read()
                        if answer.status == 200:
                            done.append(time.monotonic())
                except (aiohttp.ClientError, TimeoutError):
                    pass  # the stopped worker's connection: try again

    await asyncio.gather(*(client() for _ in range(args.clients)))
    return done


def recovery_s(one: float, bins: list[int], stopped_at: float) -> float | None:
    """Seconds from the stop to the start of the first whole second at RECOVERED_SHARE of one
    worker's throughput; None if it never came."""
    per_second = int(1 / _BIN_S)
    first = int(stopped_at / _BIN_S)
    for start in range(first, len(bins) - per_second + 1):
        if sum(bins[start : start + per_second]) >= RECOVERED_SHARE * one:
            return max(start * _BIN_S - stopped_at, 0.0)
    return None


def report(one: float, bins: list[int], stopped_at: float) -> str:
    lines = [
        f"One worker alone: {one:,.0f} requests/s.",
        f"Two workers, one SIGSTOPped at {stopped_at:.1f} s; completions per {_BIN_S:g} s:",
        "",
        "| t (s) | requests/s |",
        "|---:|---:|",
    ]
    lines += [f"| {i * _BIN_S:4.1f} | {n / _BIN_S:,.0f} |" for i, n in enumerate(bins)]
    recovered = recovery_s(one, bins, stopped_at)
    lines.append("")
    share = f"{RECOVERED_SHARE:.0%} of one worker's throughput"
    lines.append(
        f"Back at {share} {recovered:.1f} s after the stop."
        if recovered is not None
        else f"Never back at {share}."
    )
    return "\n".join(lines)
