"""The gateway's reading of one engine's KV-event stream: vLLM's wire format (which vLLM's own
decoder reads as the sim writes it) building the index, CPU-tier blocks and cache salts, when
the stream is exact and when it falls back to the estimate (a lost message, a restart, a replica
that owes events for blocks it computed), what a lost message leaves known (the blocks a hot
prefix's continuations are stored on), the replay that a late subscriber is given, the
requests in flight counted as held where they went until their blocks are stored, events
within two blocks of the estimate read as the estimate, and a publisher that sends what cannot be
read, or more than any engine step could, or faster than it is read: each such message lost and
the subscription going on, the event loop free meanwhile, one log line per inexact period, and
nothing of it left where a request's own path reads (the block size)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import msgspec
import pytest

from gateway.fleet.kv_event_stream import MAX_STEP_BLOCKS, MAX_STEP_BYTES, EventStream
from replica.sim.kv_events import (
    ALL_BLOCKS_CLEARED,
    EventPublisher,
    KvEventsConfig,
    block_removed,
    block_stored,
)
from replica.vllm_cpu.fleet import venv_python
from router_policies.block_layout import BlockLayout
from router_policies.engine_blocks import root_key, token_block_keys
from router_policies.fingerprint import fingerprint
from tests.conftest import eventually
from tests.kv_events import (
    ROOT,
    TOKENS,
    OlderReplayPublisher,
    payload,
    replaying_pair,
    running_stream,
    stored_chain,
)


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

    def test_after_a_lost_message_blocks_stored_on_a_cached_prefix_hold_it_again(self) -> None:
        """vLLM never reports a block it still caches again: forgotten whole, a hot system
        prompt's continuations could not be keyed until the engine evicted it."""
        stream = EventStream("tcp://unused", resync_s=30.0)
        system, first, second = TOKENS[:32], TOKENS[32:48], TOKENS[48:64]
        stream.apply(0, payload(block_stored([1, 2], None, system, 16, None)))
        stream.apply(1, payload(block_stored([3], 2, first, 16, None)))
        stream.lost(time.monotonic(), "replica")
        assert stream.blocks.match(token_block_keys(system, 16, ROOT)) == 0
        stream.apply(2, payload(block_stored([4], 2, second, 16, None)))
        assert stream.blocks.match(token_block_keys(system + second, 16, ROOT)) == 3
        # The first continuation's eviction may have been the message lost.
        assert stream.blocks.match(token_block_keys(system + first, 16, ROOT)) == 2

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


async def test_a_join_whose_replay_has_a_hole_is_a_lost_message() -> None:
    """An engine's replay socket drops what a slow reader's queue will not take: a join that
    applied the replay up to a hole cannot know what the missing messages evicted."""
    publisher = OlderReplayPublisher()  # its replay framed as older vLLM's: both are read
    stream = EventStream(publisher.endpoint, publisher.replay)
    stored = [block_stored([1, 2], None, TOKENS[:32], 16, None)]
    await publisher.publish(payload(*stored), sent=False)  # before the gateway started
    await publisher.publish(payload(block_removed([1, 2])), sent=False)
    publisher.forget(1)  # the eviction's message, dropped from the replay
    task = asyncio.create_task(stream.run("replica"))
    try:
        await publisher.until_joined(stream)
        assert await eventually(lambda: stream.gaps == 1, every_s=0.01)
        assert not stream.exact(time.monotonic())
        assert stream.blocks.match(token_block_keys(TOKENS[:32], 16, ROOT)) == 0
    finally:
        task.cancel()
        await publisher.close()


def test_messages_lost_in_one_inexact_period_are_logged_once_and_each_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = EventStream("tcp://unused", resync_s=2.0)
    stream.apply(0, payload())
    now = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="gateway.fleet.kv_event_stream"):
        for i in range(200):  # a hole every 5 ms, each extending the period
            stream.lost(now + i * 0.005, "replica")
        assert stream.gaps == 200 and len(caplog.records) == 1
        stream.lost(now + 1 + 2.0 + 0.1, "replica")  # after the stream was exact again
        assert stream.gaps == 201 and len(caplog.records) == 2


_ENCODE = msgspec.msgpack.encode
UNREADABLE: dict[str, Callable[[], bytes]] = {  # built when used: the last three are large
    "not msgpack": lambda: b"\xc1\xc1not msgpack",
    "not a batch": lambda: _ENCODE(42),
    "a batch too short": lambda: _ENCODE([time.time()]),
    "an event not a map": lambda: _ENCODE([time.time(), [1, 2, 3], 0]),
    "an event missing its keys": lambda: _ENCODE([time.time(), [{"type": "BlockStored"}], 0]),
    "a token id past 64 bits": lambda: payload(block_stored([9], None, [2**63] * 16, 16, None)),
    "a block hash not hashable": lambda: payload({"type": "BlockRemoved", "block_hashes": [[1]]}),
    "more block hashes than an engine step has": lambda: payload(
        block_removed(range(MAX_STEP_BLOCKS + 1))
    ),
    "more events than an engine step has": lambda: payload(
        *[ALL_BLOCKS_CLEARED] * (MAX_STEP_BLOCKS + 1)
    ),
    "more bytes than an engine step has": lambda: payload(
        block_stored([9], None, TOKENS[:16], 16, "x" * MAX_STEP_BYTES)
    ),
    "msgpack nested deeper than the decoder goes": lambda: b"\x91" * 100_000 + b"\xc0",
}


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
async def test_a_message_that_cannot_be_read_is_lost_and_the_subscription_goes_on(
    body: Callable[[], bytes],
) -> None:
    async with running_stream(resync_s=0.5) as (publisher, stream):
        publisher.publish(payload(block_stored([1, 2], None, TOKENS[:32], 16, None)))
        publisher.publish(body())
        assert await eventually(lambda: stream.gaps == 1, every_s=0.01), (
            "counted the unreadable message as lost"
        )
        assert len(stream.blocks) == 0  # what it half applied, if anything, went with the rest
        assert not stream.exact(time.monotonic())
        publisher.publish(payload(block_stored([3], None, TOKENS[32:48], 16, None)))
        publisher.publish(payload(), skip=1)  # a hole after it: still seen and counted
        assert await eventually(lambda: stream.gaps == 2, every_s=0.01), "counted the hole after it"
        assert await eventually(lambda: stream.exact(time.monotonic()), every_s=0.01), (
            "exact again after resync_s"
        )


def _sized(event: dict[str, object], block_size: object) -> dict[str, object]:
    return {**event, "block_size": block_size}


NOT_A_BLOCK_SIZE = {
    "in a string": _sized(block_stored([5], None, TOKENS[:16], 16, None), "16"),
    "negative": _sized(block_stored([5], None, TOKENS[:16], 16, None), -16),
    "a tier's, a float": _sized(block_stored([2, 4], None, [], 32, None, "CPU"), 32.0),
}


@pytest.mark.parametrize("event", NOT_A_BLOCK_SIZE.values(), ids=NOT_A_BLOCK_SIZE.keys())
async def test_a_block_size_that_is_not_a_count_is_unreadable_and_leaves_the_requests_path_whole(
    event: dict[str, object],
) -> None:
    stream = EventStream("tcp://unused", resync_s=0.0)
    await stream.read(0, payload(block_stored([1, 2, 3, 4], None, TOKENS, 16, None)), "replica")
    await stream.read(1, payload(event), "replica")
    assert stream.gaps == 1
    assert (stream.blocks.block_size, stream.blocks.tier_factor) == (16, 1)
    layout = BlockLayout(128, 16)
    request = replace(
        fingerprint("m", b"x" * 256, layout, 4096),
        token_keys=token_block_keys(TOKENS, 16, ROOT), prompt_tokens=64,
    )  # fmt: skip
    now = time.monotonic()
    stream.dispatched(request, now)  # what every request sent there, and its end, go through
    stream.held_bytes(request, layout, 0)
    stream.ended(request, 500.0, now, now)


async def test_a_large_message_is_applied_in_slices_so_the_event_loop_runs_meanwhile() -> None:
    async with running_stream() as (publisher, stream):
        n, seen = 20_000, []

        async def watch() -> None:
            while True:
                seen.append(len(stream.blocks))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        publisher.publish(payload(*(block_stored([h], None, [h] * 16, 16, None) for h in range(n))))
        assert await eventually(lambda: len(stream.blocks) == n, every_s=0.01), "applied"
        watcher.cancel()
    assert any(0 < held < n for held in seen)


async def test_a_burst_of_messages_is_read_in_slices_so_the_event_loop_runs_meanwhile() -> None:
    async with running_stream() as (publisher, stream):
        seen: list[int] = []

        async def watch() -> None:
            while True:
                seen.append(stream.next_seq or 0)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        for _ in range(900):  # fewer than the subscription's high-water mark: none dropped
            publisher.publish(payload(block_removed([1])))
        # The loop held on purpose: the whole burst is queued when the stream reads again.
        time.sleep(0.3)  # noqa: ASYNC251
        assert await eventually(lambda: stream.next_seq == publisher.next_seq, every_s=0.01), (
            "read the burst"
        )
        watcher.cancel()
        assert stream.gaps == 0
    assert max(b - a for a, b in pairwise(seen)) < 900 // 2


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


async def test_a_publisher_on_an_ipc_socket_removes_its_file_when_closed(tmp_path: Path) -> None:
    """Every sim started with events on ipc:// would otherwise leave a socket file behind."""
    pub, replay = tmp_path / "events", tmp_path / "replay"
    config = KvEventsConfig(
        enable_kv_cache_events=True, endpoint=f"ipc://{pub}", replay_endpoint=f"ipc://{replay}"
    )
    publisher = EventPublisher(config)
    publisher.publish([])
    assert pub.exists() and replay.exists()
    await publisher.close()
    assert os.listdir(tmp_path) == []
