"""``llm-gateway bench soak``: does the gateway hold steady under minutes of mixed traffic?

Zero-delay simulated replicas behind a real ``llm-gateway serve``; concurrent clients send a
mix that exercises every path a long-running gateway takes: streaming and non-streaming
requests over many tenants' system prompts (so the prefix indexes fill to their bounds),
clients that leave mid-stream, invalid bodies, unknown models and fresh request ids. Every few
seconds the gateway's resident memory (VmRSS from /proc) and the size of its /metrics page are
sampled. A leak shows as RSS that keeps climbing after warm-up; a label explosion as /metrics
growing with the request count. Writes a Markdown report (with the command that produced it)
and a plot.

``--distinct`` makes every request its own: a long prompt never sent before, a ``user`` field
and a request id of its own, and one in twenty an unknown model name of its own, so every
bounded structure (prefix indexes, hot-prefix counts, response homes, label sets) meets more
keys than it may hold. Every request then carries an API key the policy knows, the gateway
logs at DEBUG and is given a Redis URL with a password (no Redis listens there: it keeps
retrying, and says so), and the whole log is searched for the key, the password and the
prompts afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import uvloop

from bench.host import machine_description, rss_mib
from bench.launcher import start_gateway
from gateway.cli_types import non_negative_int, positive_float, positive_int
from gateway.rate_limit import hash_key
from replica.processes import ManagedProcess, free_port, start_sim_replicas

MODEL = "soak-model"
_ZERO_DELAY = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
_PROMPT_MARK = "soak-prompt-"
"""Starts every distinct prompt: what the log search looks for."""


@dataclass(frozen=True, slots=True)
class Secrets:
    """What must never reach the gateway's log, made anew for each run."""

    api_key: str = field(default_factory=lambda: "sk-soak-" + secrets.token_hex(16))
    redis_password: str = field(default_factory=lambda: "soak-pw-" + secrets.token_hex(12))


@dataclass(frozen=True, slots=True)
class LogSearch:
    lines: int
    with_key: int
    with_password: int
    with_prompt: int

    @property
    def clean(self) -> bool:
        return not (self.with_key or self.with_password or self.with_prompt)


@dataclass(frozen=True, slots=True)
class Sample:
    elapsed_s: float
    requests: int
    rss_mib: float
    metrics_bytes: int
    metrics_series: int


@dataclass(slots=True)
class Tally:
    requests: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    client_errors: int = 0
    kept_log: Path | None = None
    """The gateway's log, kept when requests failed (or it held a secret)."""
    log_search: LogSearch | None = None

    def count(self, status: int) -> None:
        self.requests += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def failed(self) -> int:
        """Answers >= 500 (none is expected: the replicas are healthy) and transport errors."""
        return self.client_errors + sum(n for s, n in self.by_status.items() if s >= 500)

    def ok(self) -> bool:
        return not self.failed() and (self.log_search is None or self.log_search.clean)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--duration-s", type=positive_float, default=180.0, help="(default: %(default)s)")
    add("--concurrency", type=positive_int, default=16, help="(default: %(default)s)")
    add("--replicas", type=positive_int, default=2, help="(default: %(default)s)")
    add("--tenants", type=positive_int, default=400, help="distinct system prompts")
    add("--sample-every-s", type=positive_float, default=5.0, help="(default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("docs/soak.md"))
    parser.add_argument("--plot", type=Path, default=Path("docs/soak.png"))
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument(
        "--distinct",
        action="store_true",
        help="every request its own long prompt, user and id; key, password and prompts "
        "searched for in the DEBUG log",
    )
    parser.add_argument(
        "--requests",
        type=non_negative_int,
        default=0,
        help="stop after this many requests (0: no bound)",
    )
    parser.add_argument(
        "--policy",
        choices=("prefix-aware", "least-loaded", "round-robin"),
        default="prefix-aware",
        help="the pool's routing policy (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    for path in (args.out, args.plot):  # before the soak, not after: a bad path fails at once
        path.parent.mkdir(parents=True, exist_ok=True)
    samples, tally = uvloop.run(_soak(args))
    command = "llm-gateway bench soak " + shlex.join(sys.argv[3:] if len(sys.argv) > 3 else [])
    _plot(samples, args.plot)
    args.out.write_text(report(samples, tally, args, command.strip()))
    print(args.out.read_text())
    return 0 if tally.ok() else 1


async def _soak(args: argparse.Namespace) -> tuple[list[Sample], Tally]:
    sims = await start_sim_replicas(args.replicas, MODEL, **_ZERO_DELAY)
    try:
        pool = {"model": MODEL, "replicas": [s.url for s in sims], "policy": args.policy}
        policy: dict[str, object] = {"pools": {"small": pool}}
        env = {"GATEWAY_LOG_LEVEL": "WARNING"}
        hidden = Secrets() if args.distinct else None
        if hidden is not None:
            tenant = {"api_key_sha256": [hash_key(hidden.api_key)]}
            policy["limits"] = {"tenants": {"soak": tenant}}
            env = {
                "GATEWAY_LOG_LEVEL": "DEBUG",
                "GATEWAY_REDIS_URL": f"redis://:{hidden.redis_password}@127.0.0.1:{free_port()}/0",
            }
        gateway = await start_gateway(policy, env=env)
        gateway.keep_log = True  # read (and then removed) below
        try:
            samples, tally = await _drive(gateway, args, hidden)
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM): no tally to judge, and the stop removes the log.
            gateway.keep_log = False
            raise
        finally:
            await gateway.stop()
        log = gateway.log_path
        if hidden is not None and log is not None:
            tally.log_search = search_log(log, hidden)
        if tally.ok() and log is not None:
            log.unlink(missing_ok=True)
        else:
            tally.kept_log = log  # the evidence outlives the run
        return samples, tally
    finally:
        await asyncio.gather(*(s.stop() for s in sims))


def search_log(log: Path, hidden: Secrets) -> LogSearch:
    lines = key = password = prompt = 0
    with log.open(errors="replace") as text:
        for line in text:
            lines += 1
            key += hidden.api_key in line
            password += hidden.redis_password in line
            prompt += _PROMPT_MARK in line
    return LogSearch(lines, key, password, prompt)


async def _drive(
    gateway: ManagedProcess, args: argparse.Namespace, hidden: Secrets | None
) -> tuple[list[Sample], Tally]:
    tally = Tally()
    samples: list[Sample] = []
    started = time.monotonic()
    deadline = started + args.duration_s
    finished = asyncio.Event()
    ids = itertools.count()
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                i = next(ids)
                if args.requests and i >= args.requests:
                    return
                if hidden is not None:
                    await _distinct(session, gateway.url, rng, i, hidden, tally)
                else:
                    await _one(session, gateway.url, rng, i, args.tenants, tally)

        async def clients() -> None:
            await asyncio.gather(*(client(args.seed * 1000 + i) for i in range(args.concurrency)))
            finished.set()

        async def sampler() -> None:
            # A session of its own: the clients keep every pooled connection busy.
            async with aiohttp.ClientSession(timeout=timeout) as own:
                while True:
                    samples.append(await _sample(own, gateway, started, tally))
                    if finished.is_set():
                        return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished.wait(), args.sample_every_s)

        await asyncio.gather(sampler(), clients())
    return samples, tally


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    i: int,
    tenants: int,
    tally: Tally,
) -> None:
    roll = rng.random()
    tenant = int(rng.paretovariate(1.2)) % tenants
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": f"You are assistant number {tenant}. " * 40},
            {"role": "user", "content": f"question {i}"},
        ],
        "max_tokens": 8,
        "stream": roll < 0.5,
    }
    if 0.90 <= roll < 0.94:
        body["model"] = "no-such-model"
    elif 0.94 <= roll < 0.97:
        body["max_tokens"] = "eight"
    data = orjson.dumps(body) if roll < 0.97 else b'{"model": "' + MODEL.encode()
    leaves = bool(body["stream"]) and roll < 0.05
    await _send(session, url, data, {"x-request-id": f"soak-{i}"}, tally, leaves=leaves)


async def _distinct(
    session: aiohttp.ClientSession,
    url: str,
    rng: random.Random,
    i: int,
    hidden: Secrets,
    tally: Tally,
) -> None:
    """One request unlike any other: a 2-8 KB prompt of its own, its own user and id."""
    roll = rng.random()
    prompt = f"{_PROMPT_MARK}{i} " + rng.randbytes(rng.randint(1024, 4096)).hex()
    body = {
        "model": MODEL if roll >= 0.05 else f"soak-unknown-model-{i}",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
        "stream": roll >= 0.5,
        "user": f"soak-user-{i}",
    }
    headers = {"x-request-id": f"soak-{i}", "Authorization": f"Bearer {hidden.api_key}"}
    await _send(session, url, orjson.dumps(body), headers, tally)


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    tally: Tally,
    *,
    leaves: bool = False,
) -> None:
    """One chat completion, counted by its status; ``leaves``: the client reads the first
    chunk and goes."""
    try:
        async with session.post(
            f"{url}/v1/chat/completions", data=data, headers=headers
        ) as response:
            if leaves:
                await response.content.readany()
                response.close()
            else:
                await response.read()
            tally.count(response.status)
    except (aiohttp.ClientError, TimeoutError):
        tally.client_errors += 1


async def _sample(
    session: aiohttp.ClientSession, gateway: ManagedProcess, started: float, tally: Tally
) -> Sample:
    async with session.get(f"{gateway.url}/metrics") as response:
        text = await response.read()
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return Sample(
        time.monotonic() - started, tally.requests, rss_mib(gateway.pid), len(text), series
    )


def report(samples: list[Sample], tally: Tally, args: argparse.Namespace, command: str) -> str:
    warm = samples[min(len(samples) - 1, max(1, len(samples) // 5))]
    last = samples[-1]
    growth = last.rss_mib - warm.rss_mib
    per_10k = growth / max(last.requests - warm.requests, 1) * 10_000
    statuses = ", ".join(f"{s}: {n:,}" for s, n in sorted(tally.by_status.items()))
    failures = ""
    if tally.failed():
        failures = (
            f"\n- **{tally.failed():,} requests failed** (answers >= 500 or transport errors; "
            f"none is expected from healthy replicas): the gateway's log was kept at "
            f"`{tally.kept_log}` for the cause."
        )
    mix = (
        f"{args.tenants} tenants' system prompts (Pareto popularity), 5% of clients leaving "
        "mid-stream,\nand 10% refused requests (unknown model, a string `max_tokens`, truncated "
        "JSON)."
    )
    searched = ""
    if args.distinct:
        mix = (
            "every request distinct: its own 2-8 KB prompt, `user` field and request id, and 5% "
            "an unknown model name\nof its own; every request carries an API key (the policy's "
            "one tenant), the gateway logs at DEBUG and\nholds a Redis URL with a password where "
            "no Redis listens."
        )
    if tally.log_search is not None:
        found = tally.log_search
        searched = (
            f"\n- The gateway's log ({found.lines:,} lines at DEBUG): {found.with_key} with the "
            f"API key, {found.with_password} with the Redis password, {found.with_prompt} with "
            "a prompt."
        )
    rows = "\n".join(
        f"| {s.elapsed_s:6.0f} | {s.requests:9,} | {s.rss_mib:7.1f} | {s.metrics_bytes:8,} "
        f"| {s.metrics_series:6,} |"
        for s in samples
    )
    return f"""# Soak: memory and /metrics size over time

Command: `{command}`
Machine: {machine_description()}. {args.replicas} zero-delay simulated replicas ({args.policy}),
{args.concurrency} concurrent clients for {last.elapsed_s:.0f} s: half the requests streamed,
{mix}

- Requests answered: {tally.requests:,} ({tally.requests / last.elapsed_s:,.0f}/s); by status:
  {statuses}; client-side errors: {tally.client_errors}.{failures}{searched}
- Gateway RSS: {samples[0].rss_mib:.1f} MiB at start, {warm.rss_mib:.1f} MiB after warm-up
  ({warm.elapsed_s:.0f} s), {last.rss_mib:.1f} MiB at the end: {growth:+.1f} MiB after warm-up,
  {per_10k:+.2f} MiB per 10,000 requests.
- /metrics: {samples[0].metrics_bytes:,} bytes ({samples[0].metrics_series} series) at start,
  {last.metrics_bytes:,} bytes ({last.metrics_series} series) at the end: label sets are
  bounded by pools, replicas, routes and status codes, not by requests.

![RSS and /metrics size over time]({args.plot.name})

| t (s) | requests | RSS (MiB) | /metrics (bytes) | series |
|---:|---:|---:|---:|---:|
{rows}
"""


def _plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss, size) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    t = [s.elapsed_s for s in samples]
    rss.plot(t, [s.rss_mib for s in samples], marker=".")
    rss.set_ylabel("gateway RSS (MiB)")
    rss.set_ylim(bottom=0)
    size.plot(t, [s.metrics_bytes / 1024 for s in samples], marker=".", color="tab:orange")
    size.set_ylabel("/metrics (KiB)")
    size.set_ylim(bottom=0)
    size.set_xlabel("time (s)")
    fig.suptitle("llm-gateway bench soak")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
