"""Helpers of the KV-cache event tests (tests/test_kv_events*.py): a prompt's tokens and the
chain an engine stores of them, vLLM's wire format, a sim's events config, and a publisher that
sends whatever a test gives it to a running stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import zmq

from gateway.fleet.kv_event_stream import EventStream
from replica.processes import free_port
from replica.sim.kv_events import EventPublisher, KvEventsConfig
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
