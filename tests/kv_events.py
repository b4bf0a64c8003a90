"""Helpers of the KV-cache event tests: vLLM's wire format, and a sim's events config."""

from __future__ import annotations

import time
from typing import Any

import msgspec


def payload(*events: dict[str, Any]) -> bytes:
    """One event batch as vLLM publishes it: ``[timestamp, events, data_parallel_rank]``."""
    return msgspec.msgpack.encode([time.time(), list(events), 0])


def events_config(port: int, replay: int | None = None) -> str:
    """A ``--kv-events-config`` publishing on ``port`` (and replaying on ``replay``)."""
    config: dict[str, Any] = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}"}
    if replay is not None:
        config["replay_endpoint"] = f"tcp://127.0.0.1:{replay}"
    return msgspec.json.encode(config).decode()
