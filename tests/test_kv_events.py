"""Routing on what each engine says it holds: vLLM's KV-cache events (BlockStored, BlockRemoved,
AllBlocksCleared over ZeroMQ), published by the simulated replica in vLLM's wire format and
read by the gateway, with the estimate as the fallback whenever the stream cannot be trusted."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from pydantic import ValidationError

from gateway.fleet.kv_event_stream import EventStream
from gateway.fleet.pools import PoolState
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.tokenize import TokenKeys, believed_held
from replica.processes import free_port
from replica.sim.kv_events import (
    ALL_BLOCKS_CLEARED,
    KvEventsConfig,
    block_removed,
    block_stored,
)
from replica.vllm_cpu.fleet import venv_python
from router_policies.block_layout import BlockLayout
from router_policies.decision import Decision, Route
from router_policies.engine_blocks import EngineBlocks, cached_tokens, root_key, token_block_keys
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures, fingerprint
from router_policies.schema import parse_policy
from tests.conftest import (
    MODEL,
    fake_replica,
    in_process_gateway,
    in_process_sims,
    metric,
    pool_policy,
)
from tests.kv_events import events_config, payload, replaying_pair

ROOT = root_key(None, None)
TOKENS = list(range(1000, 1064))  # four blocks of 16


def stored_chain(blocks: EngineBlocks, tokens: list[int], first_hash: int = 1) -> list[int]:
    """Stores ``tokens`` as one chain of 16-token blocks; returns the engine hashes used."""
    hashes = list(range(first_hash, first_hash + len(tokens) // 16))
    blocks.stored(hashes, None, tokens, 16, ROOT)
    return hashes


class TestEngineBlocks:
    def test_a_stored_chain_matches_the_requests_token_blocks(self) -> None:
        blocks = EngineBlocks()
        stored_chain(blocks, TOKENS)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        longer = TOKENS + list(range(5000, 5032))
        assert blocks.match(token_block_keys(longer, 16, ROOT)) == 4
        other = [7, *TOKENS[1:]]
        assert blocks.match(token_block_keys(other, 16, ROOT)) == 0

    def test_a_removed_block_ends_the_match_there(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.removed([hashes[2]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 2

    def test_a_block_stored_twice_is_held_until_both_copies_go(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        stored_chain(blocks, TOKENS)
        blocks.removed([hashes[0]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        blocks.removed([hashes[0]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_children_of_a_block_stored_before_the_gateway_listened_cannot_be_keyed(self) -> None:
        blocks = EngineBlocks()
        blocks.stored([2, 3], 1, TOKENS[16:48], 16, ROOT)  # parent 1 never seen
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0
        assert len(blocks) == 0

    def test_an_adapters_blocks_match_only_that_adapter(self) -> None:
        blocks = EngineBlocks()
        blocks.stored([1, 2], None, TOKENS[:32], 16, root_key("sql-lora", None))
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0
        assert blocks.match(token_block_keys(TOKENS, 16, root_key("sql-lora", None))) == 2

    def test_a_block_the_gpu_evicted_is_held_while_another_tier_holds_it(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.offloaded("CPU", hashes[:3])
        blocks.removed(hashes)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 3
        blocks.unloaded("CPU", [hashes[1]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 1
        blocks.clear()
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_a_tier_block_of_two_engine_blocks_holds_both_known_by_the_last(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.offloaded("CPU", [hashes[1], hashes[3]], block_size=32)  # vLLM: every 2nd hash
        blocks.removed(hashes)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        assert blocks.tier_tokens == 64
        # A prompt ending inside a tier block loads none of it: the tier's blocks are whole.
        assert blocks.match(token_block_keys(TOKENS[:48], 16, ROOT)) == 2
        blocks.unloaded("CPU", [hashes[1]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_another_tiers_block_no_gpu_event_keyed_matches_nothing(self) -> None:
        blocks = EngineBlocks()
        blocks.offloaded("CPU", [1, 2])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_the_engine_never_reuses_the_prompts_last_token(self) -> None:
        assert cached_tokens(4, 64, 16) == 48  # 63 tokens reusable: 3 whole blocks
        assert cached_tokens(4, 65, 16) == 64
        assert cached_tokens(2, 65, 16) == 32


class TestEventStream:
    def test_events_in_vllms_wire_format_build_the_index(self) -> None:
        stream = EventStream("tcp://unused")
        stream.apply(0, payload(block_stored([1, 2, 3, 4], None, TOKENS, 16, None)))
        stream.apply(1, payload(block_removed([4])))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 3
        stream.apply(2, payload(ALL_BLOCKS_CLEARED))
        assert len(stream.blocks) == 0

    def test_cpu_tier_events_keep_what_the_gpu_evicted_matchable(self) -> None:
        # vLLM's CPU offloading publishes its tier's blocks with medium "CPU" and no tokens.
        stream = EventStream("tcp://unused")
        stream.apply(0, payload(block_stored([1, 2, 3, 4], None, TOKENS, 16, None)))
        stream.apply(1, payload(block_stored([1, 2, 3, 4], None, [], 16, None, "CPU")))
        stream.apply(2, payload(block_removed([1, 2, 3, 4])))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        stream.apply(3, payload(block_removed([3], "CPU")))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 2

    def test_cpu_tier_blocks_larger_than_the_gpus_are_read_from_their_block_size(self) -> None:
        stream = EventStream("tcp://unused")
        stream.apply(0, payload(block_stored([1, 2, 3, 4], None, TOKENS, 16, None)))
        stream.apply(1, payload(block_stored([2, 4], None, [], 32, None, "CPU")))
        stream.apply(2, payload(block_removed([1, 2, 3, 4])))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        stream.apply(3, payload(block_removed([4], "CPU")))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 2
        assert stream.capacity_tokens(16) == 32  # one 32-token block left, and it evicted

    def test_a_cache_salt_in_the_extra_keys_seeds_the_chain(self) -> None:
        stream = EventStream("tcp://unused")
        event = block_stored([1, 2], None, TOKENS[:32], 16, None)
        event["extra_keys"] = [["tenant-a"], None]
        stream.apply(0, payload(event))
        assert stream.blocks.match(token_block_keys(TOKENS, 16, root_key(None, "tenant-a"))) == 2
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_exact_from_the_first_message_on(self) -> None:
        stream = EventStream("tcp://unused")
        assert not stream.exact(time.monotonic())
        stream.apply(0, payload())
        assert stream.exact(time.monotonic())

    def test_a_lost_message_falls_back_to_the_estimate_for_resync_s(self) -> None:
        stream = EventStream("tcp://unused", resync_s=30.0)
        stream.apply(0, payload(block_stored([1], None, TOKENS[:16], 16, None)))
        now = time.monotonic()
        stream.lost(now, "replica")
        assert not stream.exact(now + 29.0)
        assert stream.exact(now + 31.0)
        assert len(stream.blocks) == 0 and stream.gaps == 1

    def test_a_replica_silent_about_blocks_it_computed_stalls_after_stall_s(self) -> None:
        stream = EventStream("tcp://unused", stall_s=5.0)
        stream.apply(0, payload())
        now = time.monotonic()
        stream.expect(now)
        assert stream.exact(now + 4.0)
        assert not stream.exact(now + 6.0)
        stream.apply(1, payload())
        assert stream.exact(now + 6.0)

    def test_a_sequence_that_starts_over_is_a_restarted_engine(self) -> None:
        stream = EventStream("tcp://unused")
        stream.apply(5, payload(block_stored([1], None, TOKENS[:16], 16, None)))
        stream.apply(0, payload())
        assert len(stream.blocks) == 0


async def test_a_subscriber_joining_late_is_replayed_what_it_missed() -> None:
    publisher, stream = replaying_pair()
    task = asyncio.create_task(stream.run("replica"))
    try:
        publisher.publish([block_stored([1, 2], None, TOKENS[:32], 16, None)])
        publisher.publish([block_stored([3], 2, TOKENS[32:48], 16, None)])
        # The subscription may miss these (ZeroMQ's slow joiner); the replay must not.
        deadline = time.monotonic() + 10
        while stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) < 4:
            assert time.monotonic() < deadline, "replayed blocks never arrived"
            publisher.publish([block_stored([4], 3, TOKENS[48:64], 16, None)])
            await asyncio.sleep(0.1)
        assert stream.gaps == 0
    finally:
        task.cancel()
        await publisher.close()


async def test_a_subscriber_joining_an_old_engine_takes_what_its_replay_still_buffers() -> None:
    """An engine's replay keeps its last buffer_steps messages, not its first: a gateway that
    starts beside a long-running engine learns what those say rather than nothing."""
    publisher, stream = replaying_pair(buffer_steps=200)
    old, recent = TOKENS[:32], list(range(5000, 5032))
    publisher.publish([block_stored([1, 2], None, old, 16, None)])  # seq 0, soon unbuffered
    for _ in range(200):
        publisher.publish([])
    publisher.publish([block_stored([7, 8], None, recent, 16, None)])  # buffered
    task = asyncio.create_task(stream.run("replica"))
    try:
        deadline = time.monotonic() + 10
        while stream.next_seq is None:
            assert time.monotonic() < deadline, "the stream never joined"
            publisher.publish([])  # live messages, until the subscription receives one
            await asyncio.sleep(0.1)
        assert stream.blocks.match(token_block_keys(recent, 16, ROOT)) == 2
        assert stream.blocks.match(token_block_keys(old, 16, ROOT)) == 0
        assert stream.gaps == 0
    finally:
        task.cancel()
        await publisher.close()


def test_a_request_in_flight_counts_as_held_where_it_went_until_its_blocks_are_stored() -> None:
    stream = EventStream("tcp://unused")
    layout = BlockLayout(128, 16)
    prompt = fingerprint("m", b"x" * 4096, layout, 4096)
    request = replace(prompt, token_keys=(1, 2), prompt_tokens=1024)
    assert stream.held_bytes(request, layout, 0) == 0
    assert stream.dispatched(request, time.monotonic()) is None  # no event yet: not exact
    assert stream.held_bytes(request, layout, 0) == 4096
    stream.ended(request, 0.0, time.monotonic(), time.monotonic())
    assert stream.held_bytes(request, layout, 0) == 0 and not stream.inflight


def test_events_within_two_blocks_of_the_estimate_either_way_read_as_the_estimate() -> None:
    """A hot prefix's holders hold a few template tokens past its lead that its spread homes
    lack; read exactly, the copy charge billed every spread home for them and multi-round QA
    piled 48 users onto 2-3 of 8 replicas."""
    stream = EventStream("tcp://unused")
    stored_chain(stream.blocks, TOKENS[:48])  # three of the prompt's five blocks
    layout = BlockLayout(128, 16)
    prompt = fingerprint("m", b"x" * 320, layout, 4096)  # 4 bytes a token
    request = replace(prompt, token_keys=token_block_keys(TOKENS, 16, ROOT), prompt_tokens=80)
    held = 48 * 4
    assert stream.held_bytes(request, layout, held - 2 * 64) == held - 2 * 64
    assert stream.held_bytes(request, layout, held + 2 * 64) == held + 2 * 64
    assert stream.held_bytes(request, layout, held - 3 * 64) == held
    assert stream.held_bytes(request, layout, held + 3 * 64) == held


def test_a_replica_that_computed_two_blocks_and_reported_nothing_since_owes_events() -> None:
    stream = EventStream("tcp://unused", stall_s=5.0)
    stream.apply(0, payload(block_stored([1], None, TOKENS[:16], 16, None)))  # blocks of 16
    request = fingerprint("m", b"z" * 512, BlockLayout(128, 16), 4096)
    sent = time.monotonic() + 1  # after the last event
    stream.dispatched(request, sent)
    stream.ended(request, 31.0, sent, sent)  # less than two blocks: maybe nothing to store
    assert stream.exact(sent + 60)
    stream.dispatched(request, sent)
    stream.ended(request, 32.0, sent, sent)
    assert not stream.exact(sent + 6)


def test_a_replica_idle_after_reporting_its_last_requests_blocks_stays_exact() -> None:
    stream = EventStream("tcp://unused", stall_s=5.0)
    request = fingerprint("m", b"z" * 512, BlockLayout(128, 16), 4096)
    sent = time.monotonic() - 1
    stream.dispatched(request, sent)
    stream.apply(0, payload(block_stored([1, 2], None, TOKENS[:32], 16, None)))  # its blocks
    stream.ended(request, 32.0, sent, time.monotonic())
    assert stream.exact(time.monotonic() + 60)


def held_pool(url: str, **events: Any) -> tuple[PoolState, RequestFeatures]:
    """A pool whose one replica at ``url`` reads a live event stream and was sent a prompt."""
    prefix = {"source": "auto", "events": {"port": free_port(), **events}}
    policy = parse_policy(pool_policy([url], prefix=prefix))
    pool = PoolState("small", policy.pools["small"])
    (replica,) = pool.replicas.values()
    replica.kv_events = stream = EventStream("tcp://unused")
    stream.apply(0, payload(block_stored([1], None, TOKENS[:16], 16, None)))
    features = pool.router.features(MODEL, lambda: CanonicalPrompt(b"y" * 2048))
    pool.end(pool.begin(Decision(replica.name, Route.PREFIX_HOME), features))
    assert believed_held(pool, features, time.monotonic()) == (16, 2048)  # held: worth asking
    return pool, features


COMPLETION = parse_request(Endpoint.COMPLETIONS, b'{"model": "sim-model", "prompt": "y"}', 64)


async def test_a_failed_tokenize_leaves_the_request_on_the_estimate() -> None:
    pool, features = held_pool(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    async with aiohttp.ClientSession() as session:
        assert await TokenKeys(session).attach(pool, COMPLETION, features) is features


async def test_a_tokenize_slower_than_its_timeout_leaves_the_request_on_the_estimate() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"count": 1, "tokens": [1]})

    async with fake_replica(slow, "/tokenize") as url:
        pool, features = held_pool(url, tokenize_timeout_s=0.2)
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            assert await TokenKeys(session).attach(pool, COMPLETION, features) is features
        assert time.monotonic() - started < 2


def conversation(turns: int) -> list[list[dict[str, str]]]:
    """Each turn's messages: one long opening question, then short follow-ups."""
    messages = [{"role": "user", "content": "Explain the cache in detail. " * 60}]
    out = []
    for turn in range(turns):
        out.append(list(messages))
        messages += [
            {"role": "assistant", "content": f"Answer {turn}. " * 20},
            {"role": "user", "content": f"Follow-up {turn}: go on."},
        ]
    return out


async def test_a_gateway_routes_on_the_sims_events_and_predicts_their_cache_exactly() -> None:
    ports = [free_port(), free_port()]
    async with (
        in_process_sims(1, kv_events_config=events_config(ports[0])) as first,
        in_process_sims(1, kv_events_config=events_config(ports[1])) as second,
    ):
        urls = first + second
        endpoints = {u: {"endpoint": f"tcp://127.0.0.1:{p}"} for u, p in zip(urls, ports, strict=True)}  # fmt: skip
        policy = pool_policy(urls, prefix={"source": "events", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            replicas = []
            for messages in conversation(4):
                answer = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,  # type: ignore[arg-type]
                )
                replicas.append(answer.headers["x-gateway-replica"])
                await asyncio.sleep(0.2)  # the step's events reach the gateway
            assert len(set(replicas)) == 1, replicas
            text = await (await gateway.get("/metrics")).text()
    assert metric(text, "gateway_replica_kv_events_exact", replica=replicas[0]) == 1.0
    labels = {"pool": "small", "source": "events"}
    # The first turn, held nowhere, is not tokenized: only the three follow-ups are predicted.
    assert metric(text, "gateway_prefix_cached_tokens_error_count", **labels) == 3.0
    assert metric(text, "gateway_prefix_cached_tokens_error_sum", **labels) == 0.0
    estimate = metric(text, "gateway_prefix_cached_tokens_error_count", source="estimate")
    assert estimate == 4.0  # printed beside it: the estimate's error on the same requests


async def test_every_gateway_instance_subscribes_so_each_reads_the_events_without_redis() -> None:
    port = free_port()
    async with in_process_sims(1, kv_events_config=events_config(port)) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{port}"}}
        policy = pool_policy(urls, prefix={"source": "events", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as first, in_process_gateway(policy) as second:
            client = AsyncOpenAI(base_url=f"{first.make_url('/v1')}", api_key="x", max_retries=0)
            await client.chat.completions.create(
                model=MODEL,
                messages=conversation(1)[0],
                max_tokens=4,  # type: ignore[arg-type]
            )
            await asyncio.sleep(0.3)
            # The request went through the first instance only; the second saw its blocks too.
            text = await (await second.get("/metrics")).text()
    assert metric(text, "gateway_replica_kv_events_exact", replica=urls[0].split("//")[1]) == 1.0


VLLM_DECODES = r"""
import sys, msgspec
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared
batch = msgspec.msgpack.Decoder(KVEventBatch).decode(sys.stdin.buffer.read())
print(",".join(type(e).__name__ for e in batch.events), batch.events[0].token_ids[:2])
"""


def test_vllms_own_decoder_reads_the_sims_events() -> None:
    python = venv_python()
    if not python.is_file():
        pytest.skip(f"no vllm-cpu virtualenv at {python.parent.parent} (replica/vllm_cpu/install.sh)")  # fmt: skip
    sent = payload(
        block_stored([1, 2], None, TOKENS[:32], 16, "sql-lora"), block_removed([1]), ALL_BLOCKS_CLEARED
    )  # fmt: skip
    result = subprocess.run(
        [str(python), "-c", VLLM_DECODES], input=sent, capture_output=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.decode().strip().splitlines()[-1] == (
        "BlockStored,BlockRemoved,AllBlocksCleared [1000, 1001]"
    )


async def test_a_replica_whose_events_never_come_is_routed_on_the_estimate() -> None:
    silent = free_port()  # nothing publishes there
    async with in_process_sims(2) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{silent}"}}
        policy = pool_policy(urls, prefix={"source": "auto", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            replicas = set()
            for messages in conversation(3):
                answer = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,  # type: ignore[arg-type]
                )
                replicas.add(answer.headers["x-gateway-replica"])
            text = await (await gateway.get("/metrics")).text()
    assert len(replicas) == 1  # the estimate still keeps the conversation home
    assert metric(text, "gateway_replica_kv_events_exact", pool="small") == 0.0
    assert metric(text, "gateway_prefix_cached_tokens_error_count", source="events") is None


class TestPolicy:
    def test_events_only_needs_an_endpoint_for_every_replica(self) -> None:
        urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        with pytest.raises(ValidationError, match="no KV-event endpoint"):
            parse_policy(pool_policy(urls, prefix={"source": "events"}))
        policy = parse_policy(pool_policy(urls, prefix={"source": "events", "events": {"port": 5557}}))  # fmt: skip
        where = policy.pools["small"].events_endpoint(urls[1])
        assert where is not None and where.endpoint == "tcp://10.0.0.2:5557"

    def test_by_default_events_are_read_where_published_and_estimate_reads_none(self) -> None:
        urls = ["http://10.0.0.1:8000"]
        assert parse_policy(pool_policy(urls)).pools["small"].events_endpoint(urls[0]) is None
        policy = parse_policy(pool_policy(urls, prefix={"events": {"port": 5557}}))
        assert policy.pools["small"].events_endpoint(urls[0]) is not None
        policy = parse_policy(pool_policy(urls, prefix={"source": "estimate", "events": {"port": 5557}}))  # fmt: skip
        assert policy.pools["small"].events_endpoint(urls[0]) is None

    def test_endpoints_for_replicas_not_in_the_pool_are_refused(self) -> None:
        endpoints = {"http://10.9.9.9:8000": {"endpoint": "tcp://10.9.9.9:5557"}}
        with pytest.raises(ValidationError, match="not in the pool"):
            parse_policy(pool_policy(["http://10.0.0.1:8000"], prefix={"events": {"endpoints": endpoints}}))  # fmt: skip


def test_the_sim_publishes_nothing_unless_asked() -> None:
    assert KvEventsConfig.parse("") is None
    assert KvEventsConfig.parse('{"enable_kv_cache_events": false}') is None
    with pytest.raises(ValueError, match="unknown publisher"):
        KvEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "kafka"}')
