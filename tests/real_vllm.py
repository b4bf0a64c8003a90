"""Shared helpers of the real-vLLM tests (tests/test_real_vllm*.py): the `fleet` fixture, two
real vLLM replicas on the CPU behind the real gateway process (one fleet for the whole run), and the
probes of the replicas' and the gateway's metrics. Its fixture reaches those tests through
tests/conftest.py's `pytest_plugins`; it skips with the reason when real vLLM is not usable.
"""

from __future__ import annotations

import asyncio
import os
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
from replica.processes import ManagedProcess, kv_event_endpoints
from replica.vllm_cpu.fleet import start_vllm_cpu_replicas, vllm_cpu_available
from replica.vllm_cpu.tiny_model import default_dir
from tests.conftest import FAST_PROBES

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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
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
