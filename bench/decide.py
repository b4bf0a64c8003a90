"""``llm-gateway bench decide``: the time of one routing decision, the pure function alone.

A prefix-aware policy over 8 and 64 replicas whose indexes hold earlier prompts (a few
replicas hold this request's system prompt, the rest other prompts), and requests of three
sizes: an 8k-token chat (32 KB), the former 32 KB hashing cap plus a little (36 KB), and a
220 KB agent conversation hashed over its whole length. For each, the time to fingerprint
the canonical prompt, and the time of ``select`` (index matching, the cost model of every
candidate, the balance rule), as p50 and p99 over many repetitions. No network, no event
loop: what the gateway spends per request deciding, which the overhead benchmark measures
together with HTTP.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import uvloop

from bench import decide_tokens
from bench.compare.code_state import code_revision
from bench.microtime import samples_us
from gateway.cli_types import positive_int
from replica.vllm_cpu.tiny_model import default_dir
from router_policies.cost.rates import default_rates
from router_policies.cost.ttft import ReplicaLoad
from router_policies.decision import Candidate, PoolSnapshot
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures, canonical_chat
from router_policies.fingerprint import fingerprint as make_fingerprint
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.schema import PoolPolicy

COMMAND = "llm-gateway bench decide"
SIZES = (("8k-token chat", 32 * 1024), ("36 KB chat", 36 * 1024), ("220 KB agent", 220 * 1024))
REPLICAS = (8, 64)


@dataclass(frozen=True, slots=True)
class Timing:
    case: str
    replicas: int
    prompt_bytes: int
    blocks: int
    fingerprint_p50_us: float
    select_p50_us: float
    select_p99_us: float
    total_p50_us: float


def _text(rng: random.Random, size: int) -> str:
    words = ("route", "cache", "token", "prefix", "replica", "batch", "model", "agent", "tool")
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def _prompt(rng: random.Random, size: int, system: str) -> CanonicalPrompt:
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": _text(rng, max(size - len(system), 1))},
    ]
    return canonical_chat(messages)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def measure(replicas: int, size: int, case: str, repeats: int, seed: int = 0) -> Timing:
    rng = random.Random(seed)
    names = [f"10.0.0.{i}:8000" for i in range(replicas)]
    pool = PoolPolicy(model="m", replicas=[f"http://{n}" for n in names])
    policy = PrefixAware(pool)
    system = _text(rng, 8 * 1024)
    prefix = pool.prefix

    def features(prompt: CanonicalPrompt) -> RequestFeatures:
        return make_fingerprint("m", prompt, prefix.layout, prefix.max_blocks)

    request_prompt = _prompt(rng, size, system)
    request = features(request_prompt)
    # Indexes as a busy pool has them: three replicas sent this system prompt (one with this
    # very conversation), every replica sent a few other long prompts.
    from router_policies.decision import Decision, Route

    for i, name in enumerate(names):
        if i < 3:
            sent = request if i == 0 else features(_prompt(rng, size // 2, system))
            policy.record(sent, Decision(name, Route.PREFIX_HIT), now=0.0)
        for _ in range(3):
            other = features(_prompt(rng, size // 2, _text(rng, 8 * 1024)))
            policy.record(other, Decision(name, Route.PREFIX_HOME), now=0.0)
    rates = default_rates(pool.cost)
    snapshot = PoolSnapshot(
        tuple(
            Candidate(n, i % 4, ReplicaLoad(i * 100.0, i % 3, i % 4, 0.0), rates, float(i % 7))
            for i, n in enumerate(names)
        ),
        now=1.0,
    )
    fingerprint_us = _time(lambda: features(request_prompt), repeats)
    select_us = _time(lambda: policy.select(request, snapshot), repeats)
    totals = [f + s for f, s in zip(fingerprint_us, select_us, strict=True)]
    return Timing(
        case,
        replicas,
        len(request_prompt.text),
        len(request.block_hashes),
        statistics.median(fingerprint_us),
        statistics.median(select_us),
        _percentile(select_us, 99),
        statistics.median(totals),
    )


def _time(call: Callable[[], object], repeats: int) -> list[float]:
    return samples_us(call, repeats, warm=min(repeats, 50))


def format_report(timings: list[Timing], repeats: int, command: str = COMMAND) -> str:
    lines = [
        "# Decision time",
        "",
        f"Generated by `{command}` (do not edit by hand). {repeats} repetitions per row, on "
        f"{platform.machine()} with Python {platform.python_version()}; microseconds. Code: "
        f"{code_revision()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "",
        __doc__.split("\n\n", 1)[1].strip() if __doc__ else "",
        "",
        "| request | replicas | canonical bytes | blocks | fingerprint p50 | select p50 | "
        "select p99 | fingerprint + select p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(
            f"| {t.case} | {t.replicas} | {t.prompt_bytes:,} | {t.blocks:,} | "
            f"{t.fingerprint_p50_us:.0f} | {t.select_p50_us:.0f} | {t.select_p99_us:.0f} | "
            f"{t.total_p50_us:.0f} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repeats", type=positive_int, default=2000, help="per row (default: %(default)s)"
    )
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="also time what routing on KV-cache events adds: a request's /tokenize round trip "
        "(a simulated replica), tokenizing in-process, keying and matching its token blocks",
    )
    parser.add_argument(
        "--vllm", action="store_true", help="with --tokens: time a real vLLM CPU replica's too"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=default_dir("tiny") / "tokenizer.json",
        help="with --tokens: the tokenizer.json timed in-process (default: the tiny model's)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="folder of decision-time.md (default: docs)"
    )
    parser.add_argument("--no-out", action="store_true", help="print only")


def run(args: argparse.Namespace) -> int:
    timings = [
        measure(replicas, size, case, args.repeats) for replicas in REPLICAS for case, size in SIZES
    ]
    flags = " --tokens" * args.tokens + " --vllm" * (args.tokens and args.vllm)
    report = format_report(timings, args.repeats, COMMAND + flags)
    if args.tokens:

        async def tokens(vllm_url: str | None) -> list[decide_tokens.TokenTiming]:
            return await decide_tokens.measure(20, vllm_url, "tiny-llama", args.tokenizer)

        rows = uvloop.run(decide_tokens.with_vllm(tokens) if args.vllm else tokens(None))
        report += "\n" + "\n".join(decide_tokens.format_table(rows)) + "\n"
    print(report)
    if not args.no_out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decision-time.md").write_text(report, encoding="utf-8")
    return 0
