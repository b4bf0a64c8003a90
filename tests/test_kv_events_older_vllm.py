"""What older vLLM releases publish is read as vLLM 0.32's is: events as arrays (the tag, then the
fields in declaration order, trailing ones possibly left out), and replay replies without the
topic frame, each filling a hole as the current framing does; an adapter such an engine names
only by its number matches no request, not the base model's."""

from __future__ import annotations

import asyncio
import time

import msgspec

from gateway.fleet.kv_event_stream import EventStream
from replica.sim.kv_events import block_stored
from router_policies.engine_blocks import token_block_keys
from tests.conftest import eventually
from tests.kv_events import (
    ROOT,
    TOKENS,
    OlderAllBlocksCleared,
    OlderBlockRemoved,
    OlderBlockStored,
    OlderReplayPublisher,
    older_payload,
    payload,
)

KEYS = token_block_keys(TOKENS, 16, ROOT)


def test_events_as_arrays_build_the_index() -> None:
    stream = EventStream("tcp://unused")
    stream.apply(0, older_payload(OlderBlockStored([1, 2, 3, 4], None, TOKENS, 16, None, "GPU")))
    stream.apply(1, older_payload(OlderBlockRemoved([4], "GPU")))
    assert stream.blocks.match(KEYS) == 3
    stream.apply(2, older_payload(OlderAllBlocksCleared()))
    assert len(stream.blocks) == 0
    assert stream.gaps == 0 and stream.exact(time.monotonic())


def test_an_array_event_short_of_its_trailing_fields_reads_them_as_absent() -> None:
    stream = EventStream("tcp://unused")
    stored = ["BlockStored", [1, 2], None, TOKENS[:32], 16]  # no adapter, no medium: the GPU's
    stream.apply(0, msgspec.msgpack.encode([time.time(), [stored]]))
    assert stream.blocks.match(KEYS) == 2
    stream.apply(1, msgspec.msgpack.encode([time.time(), [["BlockRemoved", [2]]]]))
    assert stream.blocks.match(KEYS) == 1


def test_an_adapter_named_only_by_its_number_matches_no_request() -> None:
    stream = EventStream("tcp://unused")
    base = list(range(5000, 5032))
    stream.apply(0, older_payload(
        OlderBlockStored([1, 2], None, TOKENS[:32], 16, 7, "GPU"),
        OlderBlockStored([3, 4], None, base, 16, None, "GPU"),
    ))  # fmt: skip
    assert stream.blocks.match(KEYS) == 0
    assert stream.blocks.match(token_block_keys(base, 16, ROOT)) == 2


async def test_a_hole_is_filled_from_an_older_vllms_replay() -> None:
    publisher = OlderReplayPublisher()
    stream = EventStream(publisher.endpoint, publisher.replay)
    task = asyncio.create_task(stream.run("replica"))
    try:
        await publisher.until_joined(stream)
        assert await eventually(lambda: stream.next_seq == publisher.next_seq, every_s=0.01)
        stored = block_stored([1, 2], None, TOKENS[:32], 16, None)
        await publisher.publish(payload(stored), sent=False)  # missed
        await publisher.publish(payload())
        assert await eventually(lambda: stream.next_seq == publisher.next_seq, every_s=0.01)
        assert stream.blocks.match(KEYS) == 2
        assert stream.gaps == 0 and stream.exact(time.monotonic())
    finally:
        task.cancel()
        await publisher.close()
