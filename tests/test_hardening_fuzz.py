"""Issue 8: 10,000+ generated requests against a live gateway. Whatever a client sends, the
gateway never answers >= 500 itself, every error has the OpenAI shape, and it stays healthy.

The generator is seeded (reproducible without a new dependency). Most requests are broken in
one way the gateway must answer itself (bad JSON, wrong types, deep nesting, bad encodings,
unknown models and paths); the rest are valid or nearly so and reach zero-delay replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from bench.launcher import start_gateway
from replica.processes import ManagedProcess
from tests.conftest import FAST_PROBES, MODEL, get_text, pool_policy, running_sims

REQUESTS = 10_500
CONCURRENCY = 32
SEED = 8
LARGE = "large-lora"
"""The tier's large pool: an adapter of the same replicas, so one set of sims serves both."""

_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, 2**70, 1.5, -0.0, 1e308, "", "x", "10",
    "\u0000", "\ud7ff\ue000", "é" * 50, [], [1, 2], [None], {}, {"a": 1}, {"type": "text"},
    [{"type": "text", "text": 5}], [{"type": "image_url", "image_url": {"url": 3}}],
]  # fmt: skip
_FIELDS = [
    "model", "messages", "prompt", "stream", "n", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "tools", "tool_choice", "cache_salt", "response_format",
    "stream_options", "stop", "logprobs", "seed", "user",
]  # fmt: skip
_PATHS = ["/v1/chat/completions"] * 6 + ["/v1/completions"] * 3 + [
    "/v1/models", "/admin/route", "/admin/reload", "/v1/nope", "/", "/v1/chat/completions/x",
]  # fmt: skip


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice(["x", 1, None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def _message(rng: random.Random) -> Any:
    if rng.random() < 0.1:
        return rng.choice(_ODD_VALUES)
    message: dict[str, Any] = {
        "role": rng.choice(["system", "user", "assistant", "developer", "tool", 3, None]),
        "content": rng.choice(["hello " * rng.randint(0, 20), *_ODD_VALUES[:12]]),
    }
    if rng.random() < 0.1:
        message["content"] = [{"type": "text", "text": "part"}, _nested(rng, rng.randint(1, 80))]
    return message


def _body(rng: random.Random, path: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": rng.choice([MODEL] * 6 + ["auto", "other", ""])}
    if path == "/v1/completions":
        body["prompt"] = rng.choice(["once upon a time", ["a", "b"], [1, 2, 3], [[1], [2]], ""])
    else:
        body["messages"] = [_message(rng) for _ in range(rng.randint(0, 4))] or [
            {"role": "user", "content": "hi"}
        ]
    body["max_tokens"] = rng.randint(1, 4)
    body["stream"] = rng.random() < 0.3
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        field = rng.choice(_FIELDS)
        body[field] = (
            _nested(rng, rng.randint(1, 300)) if rng.random() < 0.1 else rng.choice(_ODD_VALUES)
        )
    return body


def _encode(rng: random.Random, body: dict[str, Any]) -> bytes:
    text = json.dumps(body)  # the stdlib writes any depth; orjson stops at 254
    roll = rng.random()
    if roll < 0.05:
        return text[: rng.randint(0, len(text))].encode()  # truncated
    if roll < 0.08:
        return rng.randbytes(rng.randint(0, 64))
    if roll < 0.10:
        return rng.choice([b"[]", b'"s"', b"1", b"null", b"{", b"\xff\xfe", b"NaN"])
    return text.encode()


def generate(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    path = rng.choice(_PATHS)
    method = "POST" if rng.random() < 0.95 else rng.choice(["GET", "PUT", "DELETE"])
    data = _encode(rng, _body(rng, path))
    hdrs = {"Content-Type": rng.choice(["application/json"] * 4 + ["text/plain", "x/y"])}
    roll = rng.random()
    if roll < 0.03:
        hdrs["Content-Encoding"] = rng.choice(["gzip", "deflate", "br", "zstd", "bogus"])
    elif roll < 0.06:
        hdrs["Content-Encoding"], data = "gzip", gzip.compress(data)
    elif roll < 0.08:
        hdrs["Content-Encoding"], data = "deflate", zlib.compress(data)
    if rng.random() < 0.1:
        hdrs["x-request-id"] = rng.choice(["ok-id", "with space", "é", "x" * 500, ""])
    if rng.random() < 0.1:
        hdrs["x-gateway-tier"] = rng.choice(["small", "large", "huge", ""])
    if rng.random() < 0.05:
        hdrs["Authorization"] = rng.choice(["Bearer ", "Bearer x", "Basic abc", "x" * 300])
    return method, path, data, hdrs


@contextlib.asynccontextmanager
async def _gateway_with_a_tier(urls: list[str]) -> AsyncIterator[ManagedProcess]:
    policy = pool_policy(urls)
    # The large pool: the same replicas' LoRA adapter (a tier needs two pools).
    policy["pools"]["large"] = {"model": LARGE, "replicas": urls}
    policy["tiers"] = {"auto": {"small": "small", "large": "large"}}
    gw = await start_gateway(policy, env={**FAST_PROBES, "GATEWAY_LOG_LEVEL": "WARNING"})
    try:
        yield gw
    finally:
        await gw.stop()


def is_openai_error(body: bytes) -> bool:
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= error.keys()


async def test_ten_thousand_generated_requests_get_no_5xx_from_the_gateway() -> None:
    rng = random.Random(SEED)
    cases = [generate(rng) for _ in range(REQUESTS)]
    statuses: Counter[int] = Counter()
    gateway_5xx: list[tuple[int, str, bytes]] = []
    not_openai: list[tuple[int, str, bytes]] = []
    unanswered: list[tuple[str, str, str, dict[str, str], bytes]] = []

    async with (
        running_sims(
            2, prefill_s_per_token=0, decode_step_s=0, decode_s_per_seq=0, lora_modules=LARGE
        ) as sims,
        _gateway_with_a_tier([s.url for s in sims]) as gw,
    ):
        queue: asyncio.Queue[tuple[str, str, bytes, dict[str, str]]] = asyncio.Queue()
        for case in cases:
            queue.put_nowait(case)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        timeout = aiohttp.ClientTimeout(total=30)
        started = time.monotonic()

        async def worker(session: aiohttp.ClientSession) -> None:
            while not queue.empty():
                method, path, data, hdrs = queue.get_nowait()
                try:
                    async with session.request(
                        method,
                        gw.url + path,
                        data=data,
                        headers=hdrs,
                        skip_auto_headers=["Accept-Encoding"],
                    ) as response:
                        body = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    unanswered.append((repr(exc), method, path, hdrs, data[:200]))
                    continue
                statuses[response.status] += 1
                from_replica = "x-gateway-replica" in response.headers
                if response.status >= 500 and not from_replica:
                    gateway_5xx.append((response.status, path, data[:200]))
                if response.status >= 400 and not is_openai_error(body):
                    not_openai.append((response.status, path, body[:200]))

        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
        elapsed = time.monotonic() - started

        assert unanswered == [], unanswered[:5]
        assert sum(statuses.values()) == REQUESTS
        assert gateway_5xx == [], gateway_5xx[:5]
        assert not_openai == [], not_openai[:5]
        assert statuses[200] > 300  # valid requests were in the mix, and were served
        assert len(statuses) > 4  # and many kinds of refusal
        status, _ = await get_text(f"{gw.url}/ready")
        assert status == 200
        assert "Traceback" not in gw.log_tail(1 << 22)
        print(f"{REQUESTS} requests in {elapsed:.1f} s: {dict(sorted(statuses.items()))}")
