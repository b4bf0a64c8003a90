"""Routing on what each engine says it holds: vLLM's KV-cache events (BlockStored, BlockRemoved,
AllBlocksCleared over ZeroMQ), published by the simulated replica in vLLM's wire format and
read by the gateway, with the estimate as the fallback whenever the stream cannot be trusted."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from gateway.fleet.kv_event_stream import EventStream
from gateway.fleet.kv_events import KvEventSubscriptions
from gateway.fleet.pools import Fleet, PoolState
from gateway.http.request_body import Endpoint, parse_request
from gateway.routing.tokenize import TokenKeys, believed_held
from replica.processes import free_port
from replica.sim.kv_events import block_stored
from router_policies.decision import Decision, Route
from router_policies.engine_blocks import token_block_keys
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures
from router_policies.schema import parse_policy
from tests.conftest import (
    MODEL,
    fake_replica,
    in_process_gateway,
    in_process_sims,
    metric,
    pool_policy,
)
from tests.kv_events import ROOT, TOKENS, events_config, payload


def held_pool(*urls: str, **events: Any) -> tuple[PoolState, RequestFeatures]:
    """A pool of replicas at ``urls`` whose last reads a live event stream and was sent a
    prompt."""
    prefix = {"source": "auto", "events": {"port": free_port(), **events}}
    policy = parse_policy(pool_policy(list(urls), prefix=prefix))
    pool = PoolState("small", policy.pools["small"])
    *_, replica = pool.replicas.values()
    replica.kv_events = stream = EventStream("tcp://unused")
    stream.apply(0, payload(block_stored([1], None, TOKENS[:16], 16, None)))
    features = pool.router.features(MODEL, lambda: CanonicalPrompt(b"y" * 2048))
    pool.end(pool.begin(Decision(replica.name, Route.PREFIX_HOME), features))
    assert believed_held(pool, features, time.monotonic()) == (16, 2048)  # held: worth asking
    return pool, features


COMPLETION = parse_request(Endpoint.COMPLETIONS, b'{"model": "sim-model", "prompt": "y"}', 64)


async def test_a_failed_tokenize_leaves_the_request_on_the_estimate() -> None:
    pool, features = held_pool(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    async with aiohttp.ClientSession() as session:
        assert await TokenKeys(session).attach(pool, COMPLETION, features) is features


async def test_a_tokenize_slower_than_its_timeout_leaves_the_request_on_the_estimate() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"count": 1, "tokens": [1]})

    async with fake_replica(slow, "/tokenize") as url:
        pool, features = held_pool(url, tokenize_timeout_s=0.2)
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            assert await TokenKeys(session).attach(pool, COMPLETION, features) is features
        assert time.monotonic() - started < 2


async def test_tokenize_asks_a_replica_requests_may_go_to_not_an_ejected_one() -> None:
    asked: list[str] = []

    async def tokenize(request: web.Request) -> web.Response:
        asked.append(request.host)
        return web.json_response({"count": 16, "tokens": TOKENS[:16]})

    async with (
        fake_replica(tokenize, "/tokenize") as failing,
        fake_replica(tokenize, "/tokenize") as serving,
    ):
        pool, features = held_pool(failing, serving)
        first = next(iter(pool.replicas.values()))
        # Ejected for failing requests while its /health passes; sent nothing since, it has
        # the fewest requests in flight.
        first.outlier.ejected_until = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            assert await TokenKeys(session).attach(pool, COMPLETION, features) is not features
        assert asked == [serving.removeprefix("http://")]


def conversation(turns: int) -> list[list[ChatCompletionMessageParam]]:
    """Each turn's messages: one long opening question, then short follow-ups."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Explain the cache in detail. " * 60}
    ]
    out: list[list[ChatCompletionMessageParam]] = []
    for turn in range(turns):
        out.append(list(messages))
        messages += [
            {"role": "assistant", "content": f"Answer {turn}. " * 20},
            {"role": "user", "content": f"Follow-up {turn}: go on."},
        ]
    return out


async def test_a_gateway_routes_on_the_sims_events_and_predicts_their_cache_exactly() -> None:
    ports = [free_port(), free_port()]
    async with (
        in_process_sims(1, kv_events_config=events_config(ports[0])) as first,
        in_process_sims(1, kv_events_config=events_config(ports[1])) as second,
    ):
        urls = first + second
        endpoints = {u: {"endpoint": f"tcp://127.0.0.1:{p}"} for u, p in zip(urls, ports, strict=True)}  # fmt: skip
        policy = pool_policy(urls, prefix={"source": "events", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            replicas = []
            for messages in conversation(4):
                answer = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,
                )
                replicas.append(answer.headers["x-gateway-replica"])
                await asyncio.sleep(0.2)  # the step's events reach the gateway
            assert len(set(replicas)) == 1, replicas
            text = await (await gateway.get("/metrics")).text()
    assert metric(text, "gateway_replica_kv_events_exact", replica=replicas[0]) == 1.0
    labels = {"pool": "small", "source": "events"}
    # The first turn, held nowhere, is not tokenized: only the three follow-ups are predicted.
    assert metric(text, "gateway_prefix_cached_tokens_error_count", **labels) == 3.0
    assert metric(text, "gateway_prefix_cached_tokens_error_sum", **labels) == 0.0
    estimate = metric(text, "gateway_prefix_cached_tokens_error_count", source="estimate")
    assert estimate == 4.0  # printed beside it: the estimate's error on the same requests


async def test_a_tier_models_requests_are_tokenized_as_the_pools_model_and_routed_on_events() -> (
    None
):
    port = free_port()
    async with (
        in_process_sims(1, kv_events_config=events_config(port)) as small,
        in_process_sims(1, "large-model") as large,
    ):
        endpoints = {small[0]: {"endpoint": f"tcp://127.0.0.1:{port}"}}
        policy = pool_policy(small, prefix={"source": "events", "events": {"endpoints": endpoints}})
        policy["pools"]["large"] = {"model": "large-model", "replicas": large}
        # Every request small: no score is above 1.
        policy["tiers"] = {"auto": {"small": "small", "large": "large", "threshold": 1.0}}
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            for messages in conversation(3):
                answer = await client.chat.completions.with_raw_response.create(
                    model="auto", messages=messages, max_tokens=8
                )
                assert answer.headers["x-gateway-tier"] == "small"
                await asyncio.sleep(0.2)  # the step's events reach the gateway
            text = await (await gateway.get("/metrics")).text()
    # The two follow-ups were predicted from the engine's events: /tokenize named the pool's
    # model, which the replica serves, not the tier's.
    labels = {"pool": "small", "source": "events"}
    assert metric(text, "gateway_prefix_cached_tokens_error_count", **labels) == 2.0
    assert metric(text, "gateway_prefix_cached_tokens_error_sum", **labels) == 0.0


async def test_every_gateway_instance_subscribes_so_each_reads_the_events_without_redis() -> None:
    port = free_port()
    async with in_process_sims(1, kv_events_config=events_config(port)) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{port}"}}
        policy = pool_policy(urls, prefix={"source": "events", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as first, in_process_gateway(policy) as second:
            client = AsyncOpenAI(base_url=f"{first.make_url('/v1')}", api_key="x", max_retries=0)
            await client.chat.completions.create(
                model=MODEL,
                messages=conversation(1)[0],
                max_tokens=4,
            )
            await asyncio.sleep(0.3)
            # The request went through the first instance only; the second saw its blocks too.
            text = await (await second.get("/metrics")).text()
    assert metric(text, "gateway_replica_kv_events_exact", replica=urls[0].split("//")[1]) == 1.0


async def test_a_replica_whose_events_never_come_is_routed_on_the_estimate() -> None:
    silent = free_port()  # nothing publishes there
    async with in_process_sims(2) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{silent}"}}
        policy = pool_policy(urls, prefix={"source": "auto", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            replicas = set()
            for messages in conversation(3):
                answer = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,
                )
                replicas.add(answer.headers["x-gateway-replica"])
            text = await (await gateway.get("/metrics")).text()
    assert len(replicas) == 1  # the estimate still keeps the conversation home
    assert metric(text, "gateway_replica_kv_events_exact", pool="small") == 0.0
    assert metric(text, "gateway_prefix_cached_tokens_error_count", source="events") is None


async def test_a_probe_failure_keeps_the_index_of_an_engine_whose_sequence_goes_on() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    endpoints = {url: {"endpoint": f"tcp://127.0.0.1:{free_port()}"}}
    policy = pool_policy([url], prefix={"source": "events", "events": {"endpoints": endpoints}})
    fleet = Fleet(parse_policy(policy))
    subscriptions = KvEventSubscriptions(lambda: fleet)
    subscriptions.reconcile()
    try:
        ((_, replica),) = fleet.replicas()
        stream = replica.kv_events
        assert stream is not None
        stream.apply(0, payload(block_stored([1, 2], None, TOKENS[:32], 16, None)))
        replica.healthy = False
        subscriptions.reconcile()
        replica.healthy = True
        subscriptions.reconcile()
        # Back, but maybe restarted: the estimate routes there until its next message says.
        assert not stream.exact(time.monotonic())
        stream.apply(1, payload())
        assert stream.exact(time.monotonic())
        assert stream.blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 2
        replica.healthy = False
        subscriptions.reconcile()
        stream.apply(0, payload())  # the engine restarted: its sequence starts over
        assert stream.exact(time.monotonic()) and len(stream.blocks) == 0
    finally:
        await subscriptions.stop()


async def test_a_prompt_the_replica_refuses_owes_no_events_so_its_stream_stays_exact() -> None:
    port = free_port()
    async with in_process_sims(1, max_model_len=256, kv_events_config=events_config(port)) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{port}"}}
        events = {"endpoints": endpoints, "stall_s": 0.3}
        policy = pool_policy(urls, prefix={"source": "events", "events": events})
        async with in_process_gateway(policy) as gateway:
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            await client.completions.create(model=MODEL, prompt="word " * 100, max_tokens=2)
            await asyncio.sleep(0.2)  # its events reach the gateway: the stream is exact
            refused = await gateway.post(
                "/v1/completions", json={"model": MODEL, "prompt": "long " * 400, "max_tokens": 2}
            )
            assert refused.status == 400
            await asyncio.sleep(1.5)  # past stall_s, and a reconcile
            text = await (await gateway.get("/metrics")).text()
    assert metric(text, "gateway_replica_kv_events_exact", pool="small") == 1.0


async def test_a_subscription_that_ended_is_started_again_and_what_ended_it_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A backstop: whatever ends a stream's task (a bug; an unreadable message is skipped in
    the task itself), the replica's events are not ignored from then on."""
    url = f"http://127.0.0.1:{free_port()}"
    endpoints = {url: {"endpoint": f"tcp://127.0.0.1:{free_port()}"}}
    policy = pool_policy([url], prefix={"source": "events", "events": {"endpoints": endpoints}})
    fleet = Fleet(parse_policy(policy))
    ((pool, replica),) = fleet.replicas()
    where = pool.policy.events_endpoint(replica.url)
    assert where is not None
    stream = replica.kv_events = EventStream(
        where.endpoint, where.replay, pool.policy.prefix.events.topic
    )
    runs: list[str] = []

    async def run(name: str) -> None:
        runs.append(name)
        if len(runs) == 1:
            raise RuntimeError("a bug in reading the events")
        await asyncio.Event().wait()

    monkeypatch.setattr(stream, "run", run)
    subscriptions = KvEventSubscriptions(lambda: fleet)
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(3):  # the task fails; it is started again; it runs on
                subscriptions.reconcile()
                await asyncio.sleep(0.01)
        assert len(runs) == 2
        logged = [r for r in caplog.records if r.exc_info and "a bug" in str(r.exc_info[1])]
        assert len(logged) == 1
        assert stream.gaps == 1  # what it missed meanwhile is unknown: inexact until resync
    finally:
        await subscriptions.stop()
