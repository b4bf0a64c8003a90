"""Helpers of the KV-cache event tests (tests/test_kv_events*.py): a prompt's tokens and the
chain an engine stores of them, vLLM's wire format and older releases', a sim's events config,
a publisher that sends whatever a test gives it to a running stream, and one that replays as
older vLLM did."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from gateway.fleet.kv_event_stream import EventStream
from replica.processes import free_port
from replica.sim.kv_events import END_SEQ, EventPublisher, KvEventsConfig
from router_policies.engine_blocks import EngineBlocks, root_key
from tests.conftest import eventually

ROOT = root_key(None, None)
TOKENS = list(range(1000, 1064))  # four blocks of 16


def stored_chain(blocks: EngineBlocks, tokens: list[int], first_hash: int = 1) -> list[int]:
    """Stores ``tokens`` as one chain of 16-token blocks; returns the engine hashes used."""
    hashes = list(range(first_hash, first_hash + len(tokens) // 16))
    blocks.stored(hashes, None, tokens, 16, ROOT)
    return hashes


def payload(*events: dict[str, Any]) -> bytes:
    """One event batch as vLLM publishes it: ``[timestamp, events, data_parallel_rank]``."""
    return msgspec.msgpack.encode([time.time(), list(events), 0])


class OlderEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """An event as vLLM declared them before they became maps: an array, its tag first."""


class OlderBlockStored(OlderEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OlderBlockRemoved(OlderEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OlderAllBlocksCleared(OlderEvent, tag="AllBlocksCleared"):
    pass


class OlderEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[OlderEvent]
    data_parallel_rank: int | None = None


def older_payload(*events: OlderEvent) -> bytes:
    """One event batch as older vLLM published it."""
    return msgspec.msgpack.encode(OlderEventBatch(time.time(), list(events), 0))


def events_config(port: int, replay: int | None = None) -> str:
    """A ``--kv-events-config`` publishing on ``port`` (and replaying on ``replay``)."""
    config: dict[str, Any] = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}
    if replay is not None:
        config["replay_endpoint"] = f"tcp://127.0.0.1:{replay}"
    return msgspec.json.encode(config).decode()


def replaying_pair(buffer_steps: int = 10_000) -> tuple[EventPublisher, EventStream]:
    """A publisher with a replay endpoint keeping ``buffer_steps`` messages, on loopback, and a
    stream of the gateway's reading both (not running yet)."""
    pub, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    config = KvEventsConfig(
        enable_kv_cache_events=True,
        endpoint=pub,
        replay_endpoint=replay,
        buffer_steps=buffer_steps,
    )
    return EventPublisher(config), EventStream(pub, replay)


class RawPublisher:
    """A PUB socket on loopback sending any payload in vLLM's framing, ``(topic, seq,
    payload)``, numbered on from the last message sent."""

    def __init__(self) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.next_seq = 0
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(100_000)  # a test's burst is never dropped on this side
        self._pub.bind(self.endpoint)

    def publish(self, body: bytes, skip: int = 0) -> None:
        """Sends ``body``, ``skip`` sequence numbers after the last (a hole where skip > 0)."""
        self.next_seq += skip
        self._pub.send_multipart((b"", self.next_seq.to_bytes(8, "big", signed=True), body))
        self.next_seq += 1

    def close(self) -> None:
        self._pub.close(linger=0)
        self._ctx.term()


class OlderReplayPublisher:
    """A publisher with a replay endpoint, as older vLLM's: its live messages framed as now,
    its replay replies without the topic, ``(client, b"", seq, payload)``, and so its end
    marker, ``(client, b"", END_SEQ, b"")``."""

    def __init__(self) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.next_seq = 0
        self._buffer: list[tuple[int, bytes]] = []
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.bind(self.endpoint)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.bind(self.replay)
        self._serving = asyncio.create_task(self._serve_replay())

    async def publish(self, body: bytes, sent: bool = True) -> None:
        """Numbers ``body`` on and buffers it; ``sent`` False: a message the subscriber missed."""
        seq = self.next_seq.to_bytes(8, "big")
        self._buffer.append((self.next_seq, body))
        self.next_seq += 1
        if sent:
            await self._pub.send_multipart((b"", seq, body))

    async def until_joined(self, stream: EventStream) -> None:
        """Live messages until ``stream`` has read one (ZeroMQ's slow joiner drops the first)."""
        deadline = time.monotonic() + 10
        while stream.next_seq is None:
            assert time.monotonic() < deadline, "the stream never joined"
            await self.publish(payload())
            await asyncio.sleep(0.05)

    def forget(self, seq: int) -> None:
        """Message ``seq`` leaves the replay's buffer: a replay from before it has a hole."""
        self._buffer = [(n, body) for n, body in self._buffer if n != seq]

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self._router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, body in self._buffer:
                if seq >= first:
                    await self._router.send_multipart((client, b"", seq.to_bytes(8, "big"), body))
            await self._router.send_multipart((client, b"", END_SEQ, b""))

    async def close(self) -> None:
        self._serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._serving
        self._ctx.destroy(linger=0)


@contextlib.asynccontextmanager
async def running_stream(resync_s: float = 30.0) -> AsyncIterator[tuple[RawPublisher, EventStream]]:
    """A raw publisher and a gateway's stream subscribed to it, running and joined: its first
    messages are lost to ZeroMQ's slow joiner, so empty ones go out until one is read."""
    publisher = RawPublisher()
    stream = EventStream(publisher.endpoint, resync_s=resync_s)
    task = asyncio.create_task(stream.run("replica"))
    try:
        deadline = time.monotonic() + 10
        while stream.next_seq is None:
            assert time.monotonic() < deadline, "the stream never joined"
            publisher.publish(payload())
            await asyncio.sleep(0.05)
        # Joining copies still in flight arrive in order: no hole, but let them land first.
        assert await eventually(lambda: stream.next_seq == publisher.next_seq, every_s=0.01), (
            "joined"
        )
        yield publisher, stream
        assert not task.done(), task  # the subscription outlived whatever the test sent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        publisher.close()
