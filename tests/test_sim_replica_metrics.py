"""The simulated replica's /metrics: vLLM's metric names and values after requests, a client
that disconnects mid-stream or before a whole answer aborts its request (counted, its blocks
freed), and two replicas in one process keep separate metrics."""

import asyncio
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from replica.sim.server import ENGINE_KEY
from tests.sim import Serve, base_url, client_for


async def scrape(server: TestServer) -> dict[str, float]:
    """Every sample on /metrics, keyed by name and labels."""
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url(server) + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_metrics_use_vllm_names(serve: Serve) -> None:
    server = await serve(block_size=32, num_blocks=256)
    async with client_for(server) as client:
        for _ in range(2):
            await client.completions.create(model="sim-model", prompt="p" * 400, max_tokens=3)
    samples = await scrape(server)

    model = "model_name=sim-model"
    assert samples[f"vllm:num_requests_running{{{model}}}"] == 0
    assert samples[f"vllm:num_requests_waiting{{{model}}}"] == 0
    assert samples[f"vllm:kv_cache_usage_perc{{{model}}}"] == 0
    assert samples[f"vllm:prefix_cache_queries_total{{{model}}}"] == 200
    assert samples[f"vllm:prefix_cache_hits_total{{{model}}}"] == 96
    assert samples[f"vllm:prompt_tokens_total{{{model}}}"] == 200
    assert samples[f"vllm:generation_tokens_total{{{model}}}"] == 6
    assert samples[f"vllm:request_success_total{{finished_reason=length,{model}}}"] == 2
    assert samples[f"sim_requests_aborted_total{{{model}}}"] == 0
    info = "block_size=32,enable_prefix_caching=True,num_gpu_blocks=256"
    assert samples[f"vllm:cache_config_info{{{info}}}"] == 1
    assert samples[f"vllm:time_to_first_token_seconds_count{{{model}}}"] == 2
    assert samples[f"vllm:e2e_request_latency_seconds_count{{{model}}}"] == 2


async def wait_until_idle(server: TestServer, timeout_s: float = 3.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await scrape(server)
        if samples["vllm:num_requests_running{model_name=sim-model}"] == 0:
            return samples
        assert time.monotonic() < deadline, "the request kept running"
        await asyncio.sleep(0.02)


async def test_client_disconnect_mid_stream_aborts_the_request(serve: Serve) -> None:
    server = await serve(decode_step_s=0.01)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            base_url(server) + "/v1/completions",
            json={"prompt": "tell me everything", "max_tokens": 5000, "stream": True},
        )
        first = await response.content.readline()
        assert first.startswith(b"data: ")
        assert server.app[ENGINE_KEY].num_running == 1
        response.close()

    samples = await wait_until_idle(server)
    assert samples["sim_requests_aborted_total{model_name=sim-model}"] == 1
    assert samples["vllm:kv_cache_usage_perc{model_name=sim-model}"] == 0
    assert samples["vllm:generation_tokens_total{model_name=sim-model}"] < 5000


async def test_client_disconnect_before_a_whole_answer_aborts_the_request(serve: Serve) -> None:
    server = await serve(decode_step_s=0.01)
    engine = server.app[ENGINE_KEY]

    async def ask() -> None:
        async with aiohttp.ClientSession() as session:
            await session.post(
                base_url(server) + "/v1/completions",
                json={"prompt": "tell me everything", "max_tokens": 5000},
            )

    task = asyncio.create_task(ask())
    for _ in range(400):
        if engine.num_running:
            break
        await asyncio.sleep(0.005)
    assert engine.num_running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    samples = await wait_until_idle(server)
    assert samples["sim_requests_aborted_total{model_name=sim-model}"] == 1
    assert engine.kv_usage() == 0.0


async def test_apps_in_one_process_keep_separate_metrics(serve: Serve) -> None:
    one, two = await serve(), await serve()
    async with client_for(one) as client:
        await client.completions.create(model="sim-model", prompt="only here", max_tokens=2)
    assert (await scrape(one))["vllm:generation_tokens_total{model_name=sim-model}"] == 2
    assert (await scrape(two))["vllm:generation_tokens_total{model_name=sim-model}"] == 0
