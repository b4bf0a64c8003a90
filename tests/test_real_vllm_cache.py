"""End to end against two real vLLM replicas on the CPU, through the real gateway process: the
prefix cache. Requests sharing a system prompt stick to one replica and hit its cache (the
engines' own counters agree), the gateway scrapes the real engines' metrics and sizes its
prefix index from them, and its cached-token predictions, from the engines' KV-cache events and
from learned token keys, land within a KV block of what vLLM reports. Needs
replica/vllm_cpu/install.sh and the tiny model (see replica/vllm_cpu/README.md); skipped with
the reason otherwise. Run with ``pytest -m vllm -rs``; the default run deselects it.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway import headers
from gateway.fleet.scrape import parse_engine_stats
from replica.vllm_launch import CPU_BLOCK_SIZE, CPU_NUM_BLOCKS
from router_policies.prefix_settings import PrefixSettings
from tests.real_vllm import (
    POOL,
    SERVED,
    RealFleet,
    engine_value,
    long_system_prompt,
    metric_samples,
    wait_for,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.asyncio(loop_scope="session"),  # the one fleet of tests/real_vllm.py
    # The first test also pays for the fixture: two replicas take 20-60 s to start.
    pytest.mark.timeout(360),
]


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
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": opening}]
            for turn in range(3):
                completion = await client.chat.completions.create(
                    model=SERVED,
                    messages=messages,
                    max_tokens=8,
                    temperature=0,
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
                temperature=0,
            )
            await asyncio.sleep(0.3)  # the engine's events for this step reach the gateway
    (events_sum, events_n), _ = await errors_since(fleet, before)
    assert events_n >= 7  # every question after the first was predicted from events
    assert events_sum / events_n <= CPU_BLOCK_SIZE
