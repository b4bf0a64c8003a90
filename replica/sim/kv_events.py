"""KV-cache events as vLLM publishes them (``--kv-events-config``), from the simulated cache.

vLLM's wire format (``vllm/distributed/kv_events.py``): a ZeroMQ PUB socket sends one
three-part message per engine step, ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian
counter, ``payload`` a msgpack ``KVEventBatch`` array ``[ts, events, data_parallel_rank]`` whose
events are maps tagged by ``type``: ``BlockStored`` (block hashes, parent hash, token ids, block
size, LoRA, medium), ``BlockRemoved`` (block hashes, medium) and ``AllBlocksCleared``; the
medium is "GPU" for the KV cache, "CPU" for its offloaded tier (replica/sim/offload.py). A
BlockStored also carries ``extra_keys``, one entry per block: the keys besides the tokens that its
hash mixed in (vLLM's ``to_event_extra_keys``): the adapter's name, then, on a request's first
block only, its ``cache_salt``; None for a block with neither.
Where a replay endpoint is set, a ROUTER socket answers a subscriber's 8-byte start sequence
with every buffered message from it on, then an end marker (sequence -1, empty payload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from pydantic import BaseModel, ConfigDict, ValidationError

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's end marker (vLLM's ``ZmqEventPublisher.END_SEQ``)."""
MEDIUM = "GPU"


class KvEventsConfig(BaseModel):
    """vLLM's ``KVEventsConfig`` fields, read from the same JSON flag."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KvEventsConfig | None:
        """The config a flag's JSON names, or None when events are off."""
        if not text:
            return None
        try:
            config = cls.model_validate_json(text)
        except ValidationError as exc:
            # One line (SimConfig names the flag): pydantic's own text spans several.
            problems = "; ".join(
                ".".join(map(str, e["loc"])) + f": {e['msg']}" if e["loc"] else e["msg"]
                for e in exc.errors()
            )
            raise ValueError(problems) from None
        publisher = config.publisher or ("zmq" if config.enable_kv_cache_events else "null")
        if not config.enable_kv_cache_events or publisher == "null":
            return None
        if publisher != "zmq":
            raise ValueError(f"unknown publisher {publisher!r}")
        return config


def block_stored(
    hashes: Sequence[int], parent: int | None, token_ids: Sequence[int], block_size: int,
    lora_name: str | None, medium: str = MEDIUM,
    extra_keys: Sequence[Sequence[str] | None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    # Keys in vLLM's field order; lora_id is deprecated upstream and sent as None.
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
    }
    if extra_keys is not None:  # vLLM leaves a None field out (msgspec's omit_defaults)
        event["extra_keys"] = [None if keys is None else list(keys) for keys in extra_keys]
    return event


def block_removed(hashes: Sequence[int], medium: str = MEDIUM) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


ALL_BLOCKS_CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


class EventPublisher:
    """Sends each step's events; keeps the last ``buffer_steps`` for replay."""

    def __init__(self, config: KvEventsConfig) -> None:
        self._topic = config.topic.encode()
        # PUB from a plain context (a send never waits); the replay's ROUTER on asyncio.
        self._pub_ctx = zmq.Context()
        self._pub = self._pub_ctx.socket(zmq.PUB)
        self._ctx = zmq.asyncio.Context()
        self._pub.set_hwm(config.hwm)
        self._pub.bind(config.endpoint)
        self._endpoints = [config.endpoint]
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        if config.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(config.replay_endpoint)
            self._endpoints.append(config.replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._encode = msgspec.msgpack.Encoder().encode

    def publish(self, events: list[dict[str, Any]]) -> None:
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay())
        payload = self._encode([time.time(), events, 0])
        seq = self._seq.to_bytes(8, "big")
        # A PUB socket never blocks: past its high-water mark it drops, as vLLM's does.
        self._pub.send_multipart((self._topic, seq, payload), flags=zmq.NOBLOCK)
        self._buffer.append((self._seq, payload))
        self._seq += 1

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                logger.warning("ignored a malformed KV-event replay request")
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        self._ctx.destroy(linger=0)
        self._pub_ctx.destroy(linger=0)
        self._remove_socket_files()

    def _remove_socket_files(self) -> None:
        for endpoint in self._endpoints:
            # ZeroMQ leaves an ipc:// socket's file behind, one per replica started, forever
            # (an abstract one, ipc://@name, has no file).
            if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
                Path(endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
