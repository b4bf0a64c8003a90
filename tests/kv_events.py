"""Helpers of the KV-cache event tests (tests/test_kv_events*.py): a prompt's tokens and the
chain an engine stores of them, vLLM's wire format, and a sim's events config."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.fleet.kv_event_stream import EventStream
from replica.processes import free_port
from replica.sim.kv_events import EventPublisher, KvEventsConfig
from router_policies.engine_blocks import EngineBlocks, root_key

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
