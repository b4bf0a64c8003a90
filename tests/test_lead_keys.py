"""A shared lead's token keys (a system prompt's, a tool set's) are learned from the requests
tokenized with it, so an opening turn behind a known lead is matched against the engines'
KV-cache events without a /tokenize round trip, and exactly as if it had been tokenized."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from gateway.app_keys import TOKEN_KEYS
from gateway.fleet.kv_event_stream import EventStream
from gateway.fleet.pools import PoolState
from gateway.http.request_body import Endpoint, ParsedRequest, parse_request
from gateway.routing.tokenize import LeadKeys, TokenKeys
from replica.processes import free_port
from replica.sim.kv_events import block_stored
from router_policies.decision import Decision, Route
from router_policies.engine_blocks import root_key, token_block_keys
from router_policies.fingerprint import RequestFeatures
from router_policies.schema import parse_policy
from tests.conftest import (
    MODEL,
    fake_replica,
    in_process_gateway,
    in_process_sims,
    metric,
    pool_policy,
)
from tests.kv_events import events_config, payload

SYSTEM = "You answer questions about the fleet's cache. " * 40
ROOT = root_key(None, None)


def rendered(body: dict[str, Any]) -> list[int]:
    """A toy chat template and tokenizer: one token per character."""
    text = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"])
    return [ord(c) for c in text]


def chat(*turns: str) -> dict[str, Any]:
    """A chat behind the shared system prompt: user and assistant turns alternating."""
    roles = ("user", "assistant")
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return {"model": MODEL, "messages": messages}


@asynccontextmanager
async def counting_tokenizer() -> AsyncIterator[tuple[str, list[int]]]:
    """A replica whose /tokenize renders with the toy template; yields its URL and the list
    of token counts it answered, one per call."""
    calls: list[int] = []

    async def tokenize(request: web.Request) -> web.Response:
        tokens = rendered(await request.json())
        calls.append(len(tokens))
        return web.json_response({"count": len(tokens), "tokens": tokens})

    async with fake_replica(tokenize, "/tokenize") as url:
        yield url, calls


def parsed_and_features(
    pool: PoolState, body: dict[str, Any]
) -> tuple[ParsedRequest, RequestFeatures]:
    parsed = parse_request(Endpoint.CHAT, orjson.dumps(body))
    return parsed, pool.router.features(MODEL, parsed.canonical_text)


def lead_pool(url: str) -> PoolState:
    """A pool whose one replica reads exact events (16-token blocks) and was sent the lead."""
    prefix = {"source": "auto", "events": {"port": free_port()}}
    pool = PoolState("small", parse_policy(pool_policy([url], prefix=prefix)).pools["small"])
    (replica,) = pool.replicas.values()
    replica.kv_events = EventStream("tcp://unused")
    replica.kv_events.apply(0, payload(block_stored([1], None, list(range(16)), 16, None)))
    _, first = parsed_and_features(pool, chat("How big is a block?"))
    pool.end(pool.begin(Decision(replica.name, Route.PREFIX_HOME), first))
    return pool


async def attach(keys: TokenKeys, pool: PoolState, body: dict[str, Any]) -> RequestFeatures:
    return await keys.attach(pool, *parsed_and_features(pool, body))


async def test_an_opening_turn_behind_a_known_lead_is_matched_without_a_round_trip() -> None:
    async with counting_tokenizer() as (url, calls), aiohttp.ClientSession() as session:
        pool, keys = lead_pool(url), TokenKeys(session)
        await attach(keys, pool, chat("What evicts a block?"))
        await attach(keys, pool, chat("Why are blocks chained?"))
        assert len(calls) == 2  # two different prompts show where the lead ends
        third = chat("Which replica holds my prompt?")
        features = await attach(keys, pool, third)
    assert len(calls) == 2
    whole = token_block_keys(rendered(third), 16, ROOT)
    lead_tokens = len(f"<system>{SYSTEM}")
    # The lead's keys are the third prompt's own first blocks, and cover the whole lead.
    assert features.token_keys == whole[: len(features.token_keys)]
    assert len(features.token_keys) >= lead_tokens // 16
    assert len(features.token_keys) <= lead_tokens // 16 + 1
    assert features.prompt_tokens > len(features.token_keys) * 16


async def test_a_later_turn_and_a_repeated_prompt_are_tokenized_whole() -> None:
    async with counting_tokenizer() as (url, calls), aiohttp.ClientSession() as session:
        pool, keys = lead_pool(url), TokenKeys(session)
        await attach(keys, pool, chat("What evicts a block?"))
        await attach(keys, pool, chat("Why are blocks chained?"))
        # A follow-up's history may be held where the estimate forgot it: all of it is asked.
        follow_up = chat("What evicts a block?", "The least recently used one.", "And then?")
        features = await attach(keys, pool, follow_up)
        assert len(calls) == 3
        assert features.token_keys == token_block_keys(rendered(follow_up), 16, ROOT)
        # A prompt the replica was sent before is believed held past its lead: asked whole.
        (replica,) = pool.replicas.values()
        again = chat("Is the cache shared?")
        _, sent = parsed_and_features(pool, again)
        pool.end(pool.begin(Decision(replica.name, Route.PREFIX_HIT), sent))
        await attach(keys, pool, again)
        assert len(calls) == 4


def tokenized(prompt: int, tokens: int = 64) -> RequestFeatures:
    """A tokenized request's features: its fingerprint ends in ``prompt``, 4 bytes a token."""
    return RequestFeatures(MODEL, (prompt,), 4 * tokens, lead_bytes=100, prompt_tokens=tokens)


def test_the_same_prompt_twice_does_not_say_where_the_lead_ends() -> None:
    leads = LeadKeys()
    key = ("small", ROOT, 1, 100)
    leads.learn(key, (1, 2, 3, 4), 2, tokenized(1))
    leads.learn(key, (1, 2, 3, 4), 2, tokenized(1))
    assert leads.known(key) is None
    leads.learn(key, (1, 2, 3, 9), 2, tokenized(2))  # sharing a block past the lead: cut there
    known = leads.known(key)
    assert known is not None and known.keys == (1, 2, 3)
    leads.learn(key, (1, 7), 2, tokenized(3))  # a prompt that parts earlier narrows the lead
    known = leads.known(key)
    assert known is not None and known.keys == (1,)


def test_two_prompts_sharing_every_whole_block_confirm_the_blocks_within_the_lead() -> None:
    leads = LeadKeys()
    key = ("small", ROOT, 1, 100)
    leads.learn(key, (1, 2, 3, 4, 5), 2, tokenized(1))
    leads.learn(key, (1, 2, 3, 4, 5), 2, tokenized(2))  # they part in the last, partial block
    known = leads.known(key)
    assert known is not None and known.keys == (1, 2, 3)


def test_a_replica_holding_another_prompt_with_the_lead_confirms_it_at_once() -> None:
    leads = LeadKeys()
    key = ("small", ROOT, 1, 100)
    # A replica's events hold three blocks of another prompt opening with the lead.
    leads.learn(key, (1, 2, 3, 4, 5), 3, tokenized(1), held=3)
    known = leads.known(key)
    assert known is not None and known.keys == (1, 2, 3)
    # Held further than a block past the lead: cut there, as two prompts sharing more are.
    leads.learn(("small", ROOT, 2, 100), (1, 2, 3, 4, 5), 2, tokenized(1), held=4)
    known = leads.known(("small", ROOT, 2, 100))
    assert known is not None and known.keys == (1, 2, 3)


def test_what_is_kept_of_a_lead_stops_a_block_past_it_whatever_follows_it() -> None:
    # The prompt's own blocks (a long user message's thousands) are no part of the lead: kept,
    # they would cost memory by the prompt's length for each of up to _LEADS leads.
    leads = LeadKeys()
    key = ("small", ROOT, 1, 100)
    leads.learn(key, tuple(range(1, 5000)), 2, tokenized(1))
    assert leads.known(key) is None  # one prompt does not say where the lead ends...
    assert len(leads._leads[key].keys) == 3  # ...but it ends within 2 blocks
    leads.learn(key, (1, 2, 3, 9), 2, tokenized(2))
    known = leads.known(key)
    assert known is not None and known.keys == (1, 2, 3)


def test_a_replica_holding_under_half_the_lead_confirms_nothing() -> None:
    leads = LeadKeys()
    key = ("small", ROOT, 1, 100)
    leads.learn(key, (1, 2, 3, 4, 5), 4, tokenized(1), held=1)  # the rest may be evicted
    assert leads.known(key) is None


def test_leads_are_forgotten_least_recently_used_first() -> None:
    leads = LeadKeys(capacity=2)
    for lead in (1, 2):
        leads.learn(("small", ROOT, lead, 100), (1, 2), 1, tokenized(1))
        leads.learn(("small", ROOT, lead, 100), (1, 3), 1, tokenized(2))
    assert leads.known(("small", ROOT, 1, 100)) is not None  # used: 2 is now the oldest
    leads.learn(("small", ROOT, 3, 100), (1, 2), 1, tokenized(1))
    assert leads.known(("small", ROOT, 2, 100)) is None
    assert leads.known(("small", ROOT, 1, 100)) is not None


async def test_on_a_sims_template_the_leads_keys_predict_the_engines_cache_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    async with in_process_sims(1, kv_events_config=events_config(port)) as urls:
        endpoints = {urls[0]: {"endpoint": f"tcp://127.0.0.1:{port}"}}
        policy = pool_policy(urls, prefix={"source": "events", "events": {"endpoints": endpoints}})
        async with in_process_gateway(policy) as gateway:
            token_keys = gateway.app[TOKEN_KEYS]
            round_trips = 0
            tokenize = token_keys._tokenize

            async def counted(*args: Any) -> Any:
                nonlocal round_trips
                round_trips += 1
                return await tokenize(*args)

            monkeypatch.setattr(token_keys, "_tokenize", counted)
            client = AsyncOpenAI(base_url=f"{gateway.make_url('/v1')}", api_key="x", max_retries=0)
            questions = [f"Question {i}: what does block {i} hold?" for i in range(6)]
            for question in questions:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=chat(question)["messages"],
                    max_tokens=4,
                )
                await asyncio.sleep(0.2)  # the step's events reach the gateway
            text = await (await gateway.get("/metrics")).text()
    # The first question is held nowhere; the second is tokenized, and the replica holding the
    # first shows where the two part; the last four are not.
    assert round_trips == 1
    labels = {"pool": "small", "source": "events"}
    assert metric(text, "gateway_prefix_cached_tokens_error_count", **labels) == 5.0
    assert metric(text, "gateway_prefix_cached_tokens_error_sum", **labels) == 0.0
