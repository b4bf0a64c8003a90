"""/metrics: real Prometheus text, the CONTRACT names, figures that follow the traffic."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import metrics as names
from tests.conftest import (
    MODEL,
    chat,
    get_text,
    metric_sum,
    official_client,
    running_gateway,
    running_sims,
)

CONTRACT = {
    "gateway_requests_total",
    "gateway_ttft_seconds_bucket",
    "gateway_request_duration_seconds_bucket",
    "gateway_replica_inflight",
    "gateway_replica_healthy",
    "gateway_pool_queue_depth",
    "gateway_pool_desired_replicas",
}


async def test_metrics_parse_and_carry_the_contract_names() -> None:
    async with running_sims(2) as replicas:
        async with (
            running_gateway([r.url for r in replicas]) as gw,
            aiohttp.ClientSession() as session,
        ):
            for stream in (False, True):
                body = orjson.dumps(chat("metrics test system prompt " * 10, "q", stream=stream))
                async with session.post(f"{gw.url}/v1/chat/completions", data=body) as response:
                    assert response.status == 200
                    await response.read()
            async with session.post(f"{gw.url}/v1/chat/completions", data=b"{") as response:
                assert response.status == 400
            _, text = await get_text(f"{gw.url}/metrics")

    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert CONTRACT <= {s.name for s in samples}
    assert not [s.name for s in samples if s.name.startswith("vllm:")]

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )  # fmt: skip

    assert value("gateway_requests_total", pool="small", code="200") == 2
    assert value("gateway_pool_arrivals_total", pool="small") == 2  # the 400 never had a pool
    assert value("gateway_requests_total", pool=names.NO_POOL, code="400") == 1
    assert value("gateway_ttft_seconds_count", pool="small") == 1  # only the streamed one
    assert value("gateway_request_duration_seconds_count", pool="small") == 2
    # A whole answer may take up to GATEWAY_ANSWER_TIMEOUT_S: its quantile needs buckets there.
    bounds = {
        float(s.labels["le"])
        for s in samples
        if s.name == "gateway_request_duration_seconds_bucket"
    }
    assert {600.0, 1800.0} <= bounds
    assert value("gateway_replica_healthy", pool="small") == 2
    assert value("gateway_replica_inflight", pool="small") == 0
    assert value("gateway_pool_desired_replicas", pool="small") >= 1


async def test_replica_capacity_is_estimated_from_learned_rates_before_any_saturation() -> None:
    """No request ever waits here, so no saturation capacity is measured; once each replica
    has learned its rates from streamed answers, the capacity the autoscaling signal runs on
    (estimated from those rates) is exported, and absent before."""

    def capacity(text: str) -> list[float]:
        return [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == names.POOL_REPLICA_CAPACITY
        ]

    async with running_sims(2) as replicas:
        async with (
            running_gateway([r.url for r in replicas]) as gw,
            aiohttp.ClientSession() as session,
        ):
            _, before = await get_text(f"{gw.url}/metrics")
            for i in range(40):
                # Prompts of several lengths, so prefill and step costs can be told apart.
                system = f"tenant {i} system prompt " * (5 + 20 * (i % 4))
                body = orjson.dumps(chat(system, "q", stream=True))
                async with session.post(f"{gw.url}/v1/chat/completions", data=body) as response:
                    assert response.status == 200
                    await response.read()
            await asyncio.sleep(0.5)  # a scrape round (0.2 s here) runs the estimate
            _, after = await get_text(f"{gw.url}/metrics")

    assert capacity(before) == []
    [estimated] = capacity(after)
    assert 0 < estimated < float("inf")


@pytest.mark.parametrize(
    "instructions", [None, "One line per item, e.g. event: birthday"], ids=["plain", "echoed"]
)
async def test_a_responses_streams_ttft_waits_for_its_first_token_not_its_opening_events(
    instructions: str | None,
) -> None:
    # vLLM sends response.created and response.in_progress as the request starts; the first
    # token comes after the prefill, here ~0.5 s of it. Both repeat the request's instructions,
    # which may read like an event's line.
    async with running_sims(1, prefill_s_per_token=0.002) as replicas:
        async with running_gateway([r.url for r in replicas]) as gw:
            stream = await official_client(gw.url).responses.create(
                model=MODEL,
                input="Tell me a story. " * 60,
                max_output_tokens=2,
                stream=True,
                instructions=instructions,
            )
            kinds = [event.type async for event in stream]
            ttft = await metric_sum(gw.url, "gateway_ttft_seconds_sum", pool="small")
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds and ttft > 0.25
