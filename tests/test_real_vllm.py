"""End to end against two real vLLM replicas on the CPU, through the real gateway process.

Needs replica/vllm_cpu/install.sh and the tiny model (see replica/vllm_cpu/README.md); skipped
with the reason otherwise. Run with ``pytest -m vllm -rs``; the default run deselects it.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench.launcher import start_gateway
from gateway import headers
from gateway.fleet.scrape import parse_engine_stats
from replica.processes import ManagedProcess, kv_event_endpoints
from replica.vllm_cpu.fleet import start_vllm_cpu_replicas, vllm_cpu_available
from replica.vllm_cpu.tiny_model import default_dir
from replica.vllm_launch import CPU_BLOCK_SIZE, CPU_NUM_BLOCKS
from router_policies.schema import PrefixSettings
from tests.conftest import FAST_PROBES

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="module"),
    # The first test also pays for the fixture: two replicas take 20-60 s to start.
    pytest.mark.timeout(360),
]

SERVED = "tiny-llama"
POOL = "tiny"
RESPONSES_STORE = "VLLM_ENABLE_RESPONSES_API_STORE"


@dataclass
class RealFleet:
    gateway: str
    replicas: dict[str, str]
    """Replica name as in x-gateway-replica -> its base URL."""

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.gateway}/v1", api_key="unused", max_retries=0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet() -> AsyncIterator[RealFleet]:
    model_dir = default_dir("tiny")
    reason = await asyncio.to_thread(vllm_cpu_available, None, model_dir)
    if reason is not None:
        pytest.skip(f"real vLLM on the CPU is not usable: {reason}")
    # vLLM keeps /v1/responses for previous_response_id only with its store on; the replicas'
    # environment is taken from this process's when they are built.
    store_was = os.environ.get(RESPONSES_STORE)
    os.environ[RESPONSES_STORE] = "1"
    try:
        replicas = await start_vllm_cpu_replicas(2, model_dir, SERVED)
    finally:
        if store_was is None:
            os.environ.pop(RESPONSES_STORE, None)
        else:
            os.environ[RESPONSES_STORE] = store_was
    gateway: ManagedProcess | None = None
    try:
        policy = {
            "pools": {
                POOL: {
                    "model": SERVED,
                    "replicas": [r.url for r in replicas],
                    "policy": "prefix-aware",
                    # The engines publish KV-cache events (the launch recipe): route on them.
                    "prefix": {
                        "source": "events",
                        "events": {"endpoints": kv_event_endpoints(r.url for r in replicas)},
                    },
                }
            }
        }
        gateway = await start_gateway(policy, env=FAST_PROBES)
        yield RealFleet(gateway.url, {r.url.split("://", 1)[1]: r.url for r in replicas})
    finally:
        if gateway is not None:
            await gateway.stop()
        await asyncio.gather(*(r.stop() for r in replicas))


async def metric_samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of ``url``/metrics, read with prometheus_client's own parser."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


async def engine_value(url: str, name: str, **labels: str) -> float:
    """A replica's sample ``name`` summed over label sets matching ``labels``."""
    return sum(
        value
        for sample, sample_labels, value in await metric_samples(url)
        if sample == name and labels.items() <= sample_labels.items()
    )


async def wait_for(probe: Any, predicate: Any, timeout_s: float, interval_s: float = 0.1) -> Any:
    """Polls ``await probe()`` until ``predicate(value)``; returns the last value either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if predicate(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval_s)


def long_system_prompt(rules: int = 40) -> str:
    """A system prompt of ~900 tiny-tokenizer tokens, unique to the call (so it starts cold)."""
    colours = ("red", "blue", "green")
    body = " ".join(f"rule {i} says the {colours[i % 3]} thing matters most" for i in range(rules))
    return f"You are assistant {uuid.uuid4().hex}. Follow these rules. {body}"


async def test_openai_chat_streamed_text_equals_unstreamed(fleet: RealFleet) -> None:
    request: dict[str, Any] = {
        "model": SERVED,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours."},
        ],
        "max_tokens": 24,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},  # a random model may end at once; fix the length
    }
    async with fleet.client() as client:
        whole = await client.chat.completions.create(**request)
        stream = await client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        parts: list[str] = []
        usage = None
        async for chunk in stream:
            parts.extend(choice.delta.content or "" for choice in chunk.choices)
            usage = chunk.usage or usage
    text = whole.choices[0].message.content
    assert text and "".join(parts) == text
    assert whole.model == SERVED
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    assert usage is not None and usage.completion_tokens == 24
    assert usage.prompt_tokens == whole.usage.prompt_tokens


async def test_openai_completions_streamed_text_equals_unstreamed(fleet: RealFleet) -> None:
    request: dict[str, Any] = {
        "model": SERVED,
        "prompt": "Once upon a time, in a land of tiny models,",
        "max_tokens": 32,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    async with fleet.client() as client:
        whole = await client.completions.create(**request)
        stream = await client.completions.create(**request, stream=True)
        parts = [choice.text async for chunk in stream for choice in chunk.choices]
    assert whole.choices[0].text and "".join(parts) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 32


async def test_shared_system_prompt_sticks_to_one_replica_and_hits_its_cache(
    fleet: RealFleet,
) -> None:
    system = long_system_prompt()
    before = {
        name: (
            await engine_value(url, "vllm:prefix_cache_hits_total"),
            await engine_value(url, "vllm:prefix_cache_queries_total"),
        )
        for name, url in fleet.replicas.items()
    }
    seen: list[tuple[str, str, int, int]] = []
    async with fleet.client() as client:
        for question in ("What is rule 3?", "And rule 5?", "Summarise rule 7.", "Why rule 11?"):
            raw = await client.chat.completions.with_raw_response.create(
                model=SERVED,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                max_tokens=4,
                temperature=0,
            )
            completion = raw.parse()
            assert raw.headers[headers.POOL] == POOL
            usage = completion.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            cached = usage.prompt_tokens_details.cached_tokens or 0
            seen.append(
                (
                    raw.headers[headers.REPLICA],
                    raw.headers[headers.ROUTE],
                    cached,
                    usage.prompt_tokens,
                )
            )
    replicas = {replica for replica, _, _, _ in seen}
    assert len(replicas) == 1, seen
    (home,) = replicas
    routes = [route for _, route, _, _ in seen]
    assert routes[0] in ("prefix-home", "least-loaded"), seen
    assert routes[1:] == ["prefix-hit"] * 3, seen
    hits_seen = [c for _, _, c, _ in seen]
    prompt_tokens = seen[0][3]
    assert prompt_tokens > 500, seen  # long enough for the shared prefix to dominate
    assert hits_seen[0] == 0, seen  # a fresh prompt: nothing to reuse
    # The repeated system prompt is served from the KV cache, whole blocks of it.
    assert all(c >= prompt_tokens - 2 * CPU_BLOCK_SIZE - 16 for c in hits_seen[1:]), seen
    assert all(c % CPU_BLOCK_SIZE == 0 for c in hits_seen), seen
    # The engines' own counters agree: hits rose on the home replica only, and the other one
    # never even saw these requests.
    for name, url in fleet.replicas.items():
        hits = await engine_value(url, "vllm:prefix_cache_hits_total")
        queries = await engine_value(url, "vllm:prefix_cache_queries_total")
        if name == home:
            assert hits - before[name][0] >= sum(hits_seen), (hits, before[name])
        else:
            assert (hits, queries) == before[name]


async def test_gateway_scrapes_the_real_engine_metrics(fleet: RealFleet) -> None:
    names = set(fleet.replicas)
    # One answer's usage teaches the gateway the model's characters per token.
    await fleet.client().chat.completions.create(
        model=SERVED,
        messages=[
            {"role": "system", "content": long_system_prompt()},
            {"role": "user", "content": "hi"},
        ],
        max_tokens=2,
    )

    async def gateway_samples() -> list[tuple[str, dict[str, str], float]]:
        return await metric_samples(fleet.gateway)

    def covers_both(samples: list[tuple[str, dict[str, str], float]]) -> bool:
        kv = {
            labels["replica"] for name, labels, _ in samples if name == "gateway_replica_kv_usage"
        }
        return kv == names

    samples = await wait_for(gateway_samples, covers_both, timeout_s=5.0)

    def by_replica(metric: str) -> dict[str, float]:
        return {
            labels["replica"]: value
            for name, labels, value in samples
            if name == metric and labels.get("pool") == POOL
        }

    assert set(by_replica("gateway_replica_kv_usage")) == names
    assert all(0.0 <= v <= 1.0 for v in by_replica("gateway_replica_kv_usage").values())
    assert set(by_replica("gateway_replica_engine_waiting")) == names
    assert by_replica("gateway_replica_healthy") == dict.fromkeys(names, 1.0)
    healthy = [
        v
        for n, labels, v in samples
        if n == "gateway_pool_healthy_replicas" and labels["pool"] == POOL
    ]
    assert healthy == [2.0]
    # What the gateway resizes each replica's prefix index from: the real cache_config_info.
    for url in fleet.replicas.values():
        async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
            stats = parse_engine_stats(await response.text())
        assert stats.kv_capacity_tokens == CPU_NUM_BLOCKS * CPU_BLOCK_SIZE
    # ...at the characters per token the replicas' usage taught the gateway: the tiny Llama's
    # byte-level BPE packs fewer than the 4 assumed before any answer, so the index is smaller
    # than the default would make it (a belief that vLLM had not evicted what it had).
    prefix = PrefixSettings()
    kv_tokens = CPU_NUM_BLOCKS * CPU_BLOCK_SIZE
    assumed = kv_tokens * prefix.chars_per_token / prefix.block_bytes
    for blocks in by_replica("gateway_replica_prefix_index_blocks").values():
        engine = blocks / prefix.index_memory  # the index remembers that many caches' worth
        assert kv_tokens * 1.5 / prefix.block_bytes <= engine < assumed


async def test_client_disconnect_mid_stream_frees_the_engine(fleet: RealFleet) -> None:
    tokens_before = {
        url: await engine_value(url, "vllm:generation_tokens_total")
        for url in fleet.replicas.values()
    }
    async with fleet.client() as client:
        async with client.completions.with_streaming_response.create(
            model=SERVED,
            prompt="Tell me a very long story.",
            max_tokens=1800,  # ~10 s of decoding on one core: far from done when we hang up
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as response:
            url = fleet.replicas[response.headers[headers.REPLICA]]
            chunks = 0
            async for chunk in await response.parse():
                chunks += len(chunk.choices)
                if chunks >= 5:
                    break

            async def running() -> float:
                return await engine_value(url, "vllm:num_requests_running")

            assert await wait_for(running, lambda v: v == 1.0, timeout_s=5.0) == 1.0
        # Leaving the block closes the connection mid-stream.
    hung_up = time.monotonic()
    assert await wait_for(running, lambda v: v == 0.0, timeout_s=8.0) == 0.0
    assert time.monotonic() - hung_up < 8.0
    # Stopped, not run to its 1,800 tokens (vLLM 0.32 does not count client aborts in
    # vllm:request_success_total{finished_reason="abort"}, so the token counter tells).
    generated = await engine_value(url, "vllm:generation_tokens_total") - tokens_before[url]
    assert 5 <= generated < 900, generated


async def post_json(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, dict(response.headers), await response.json()


async def test_tokenize_and_detokenize_through_the_gateway(fleet: RealFleet) -> None:
    text = "the red thing matters most"
    status, hdrs, tokens = await post_json(
        f"{fleet.gateway}/tokenize", {"model": SERVED, "prompt": text}
    )
    assert status == 200, tokens
    assert hdrs[headers.POOL] == POOL and hdrs[headers.REPLICA] in fleet.replicas
    assert tokens["count"] == len(tokens["tokens"]) > 0
    direct = await post_json(
        f"{fleet.replicas[hdrs[headers.REPLICA]]}/tokenize", {"model": SERVED, "prompt": text}
    )
    assert direct[2]["tokens"] == tokens["tokens"]
    # vLLM serves its one model when none is named; so does the gateway with one pool.
    status, _, back = await post_json(
        f"{fleet.gateway}/detokenize", {"tokens": tokens["tokens"][1:]}
    )
    assert status == 200 and back["prompt"].strip() == text


async def test_completions_with_a_batch_of_prompts(fleet: RealFleet) -> None:
    prompts = ["Once upon a time,", "In a land of tiny models,", "The end."]
    async with fleet.client() as client:
        batch = await client.completions.create(
            model=SERVED, prompt=prompts, max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        alone = await client.completions.create(
            model=SERVED, prompt=prompts[1], max_tokens=6, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    assert sorted(c.index for c in batch.choices) == [0, 1, 2]
    second = next(c for c in batch.choices if c.index == 1)
    assert second.text == alone.choices[0].text
    assert batch.usage is not None and batch.usage.completion_tokens == 18


async def test_responses_streamed_and_followed_up_on_the_same_replica(fleet: RealFleet) -> None:
    instructions = long_system_prompt(10)
    async with fleet.client() as client:
        raw = await client.responses.with_raw_response.create(
            model=SERVED, instructions=instructions, input="Name a colour.",
            max_output_tokens=8, temperature=0,
        )  # fmt: skip
        first = raw.parse()
        assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
        assert first.usage is not None and first.usage.input_tokens > 0
        stream = await client.responses.create(
            model=SERVED, instructions=instructions, input="Name a colour.",
            max_output_tokens=8, temperature=0, stream=True,
        )  # fmt: skip
        kinds, completed = [], None
        async for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                completed = event.response
        assert kinds[0] == "response.created" and completed is not None
        assert completed.output_text == first.output_text
        got = await client.responses.with_raw_response.retrieve(first.id)
        assert got.parse().output_text == first.output_text
        assert got.headers[headers.REPLICA] == raw.headers[headers.REPLICA]
        # The stored response lives in one replica's memory: the follow-up must go there.
        for previous, replica in ((first.id, raw.headers[headers.REPLICA]), (completed.id, None)):
            follow = await client.responses.with_raw_response.create(
                model=SERVED, input="Another one.", previous_response_id=previous,
                max_output_tokens=4, temperature=0,
            )  # fmt: skip
            assert follow.parse().previous_response_id == previous
            if replica is not None:
                assert follow.headers[headers.REPLICA] == replica


PredictionErrors = dict[str, tuple[float, float]]


async def prediction_errors(fleet: RealFleet) -> PredictionErrors:
    """The gateway's cached-token prediction errors so far, by source: (sum, count)."""
    samples = await metric_samples(fleet.gateway)
    out = {}
    for source in ("events", "estimate"):
        total = [v for n, lab, v in samples if n.endswith("error_sum") and lab["source"] == source]  # fmt: skip
        count = [v for n, lab, v in samples if n.endswith("error_count") and lab["source"] == source]  # fmt: skip
        out[source] = (sum(total), sum(count))
    return out


async def errors_since(fleet: RealFleet, before: PredictionErrors) -> list[tuple[float, float]]:
    """(sum, count) of the events' errors, then the estimate's, since ``before``."""
    after = await prediction_errors(fleet)
    return [
        (after[s][0] - before[s][0], after[s][1] - before[s][1]) for s in ("events", "estimate")
    ]


async def test_kv_events_predict_each_requests_cached_tokens_within_a_block(
    fleet: RealFleet,
) -> None:
    """What the gateway predicted each request would find cached, against the cached_tokens
    vLLM reported for it: from the engines' KV-cache events, and from the estimate beside it."""

    before = await prediction_errors(fleet)
    rng = random.Random(7)
    words = ("cache", "block", "token", "replica", "route", "prefix", "engine", "queue")
    async with fleet.client() as client:
        for conversation in range(6):
            opening = " ".join(rng.choice(words) for _ in range(250 + 40 * conversation))
            messages: list[dict[str, str]] = [{"role": "user", "content": opening}]
            for turn in range(3):
                completion = await client.chat.completions.create(
                    model=SERVED,
                    messages=messages,
                    max_tokens=8,
                    temperature=0,  # type: ignore[arg-type]
                )
                answer = completion.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"Turn {turn}: and then?"},
                ]
                await asyncio.sleep(0.3)  # the engine's events for this step reach the gateway
    (events_sum, events_n), (estimate_sum, estimate_n) = await errors_since(fleet, before)
    assert events_n >= 12  # most requests were predicted from events
    events_mae = events_sum / events_n
    estimate_mae = estimate_sum / max(estimate_n, 1)
    print(
        f"cached-token prediction, mean absolute error: events {events_mae:.1f} tokens over the "
        f"{events_n:.0f} requests held somewhere (tokenized), estimate {estimate_mae:.1f} "
        f"tokens over all {estimate_n:.0f} (KV block {CPU_BLOCK_SIZE} tokens)"
    )
    assert events_mae <= CPU_BLOCK_SIZE, (events_mae, estimate_mae)


async def test_a_shared_system_prompts_learned_keys_predict_the_cache_within_a_block(
    fleet: RealFleet,
) -> None:
    """Opening turns behind one system prompt: after one is tokenized, the rest are matched on
    the lead's learned token keys (tests/test_lead_keys.py counts the round trips), and on
    vLLM's own chat template and tokenizer they predict its cache as closely."""
    before = await prediction_errors(fleet)
    system = long_system_prompt()
    async with fleet.client() as client:
        for question in range(8):
            await client.chat.completions.create(
                model=SERVED,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Question {question}: which rule matters?"},
                ],
                max_tokens=4,
                temperature=0,  # type: ignore[arg-type]
            )
            await asyncio.sleep(0.3)  # the engine's events for this step reach the gateway
    (events_sum, events_n), _ = await errors_since(fleet, before)
    assert events_n >= 7  # every question after the first was predicted from events
    assert events_sum / events_n <= CPU_BLOCK_SIZE
