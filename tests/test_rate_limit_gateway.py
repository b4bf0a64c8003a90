"""Per-tenant rate limits as clients see them, through the official OpenAI client: keys
authenticate, limits answer 429 with OpenAI's body and headers, successes carry the headers
too, /metrics counts per tenant name, and the limits follow a policy reload."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry, Counter

from gateway import headers
from gateway.http.app import build_app
from gateway.rate_limit import Admission, BucketStore, LocalStore, RateLimiter, hash_key
from gateway.rate_limit.leases import LeasedStore
from gateway.rate_limit.limiter import RateLimited, Tenant
from gateway.rate_limit.redis_store import RedisStore
from gateway.settings import Settings
from router_policies.limits_settings import TenantLimits
from router_policies.rate_limit import BucketView, Verdict
from router_policies.schema import parse_policy
from tests.conftest import (
    FAST_PROBE_SETTINGS,
    MODEL,
    GatewayClient,
    in_process_gateway,
    in_process_sims,
)
from tests.rate_limits import ACME_KEY, GLOBEX_KEY, MESSAGES, limited_policy, tenant
from tests.redis_server import running_redis, script_calls

RATELIMIT_HEADERS = (
    headers.RATELIMIT_LIMIT_REQUESTS, headers.RATELIMIT_REMAINING_REQUESTS,
    headers.RATELIMIT_RESET_REQUESTS, headers.RATELIMIT_LIMIT_TOKENS,
    headers.RATELIMIT_REMAINING_TOKENS, headers.RATELIMIT_RESET_TOKENS,
)  # fmt: skip


_open_clients: list[AsyncOpenAI] = []


def openai_client(gateway: GatewayClient, key: str) -> AsyncOpenAI:
    # max_retries=0: the SDK would otherwise retry 429s itself, after Retry-After.
    client = AsyncOpenAI(
        base_url=str(gateway.make_url("/v1")), api_key=key, max_retries=0, timeout=30
    )
    _open_clients.append(client)
    return client


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _open_clients:
        await _open_clients.pop().close()


def duration_s(text: str) -> float:
    """x-ratelimit-reset-* back to seconds: "20ms", "1.5s", "1m0s"."""
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    minutes, _, seconds = text.removesuffix("s").rpartition("m")
    return float(minutes or 0) * 60 + float(seconds)


@contextlib.asynccontextmanager
async def gateway_with(
    limits_section: dict[str, Any], **settings: Any
) -> AsyncIterator[GatewayClient]:
    async with (
        in_process_sims(1, decode_step_s=0.0) as urls,
        in_process_gateway(limited_policy(urls, **limits_section), **settings) as gateway,
    ):
        yield gateway


async def chat(client: AsyncOpenAI, max_tokens: int = 8) -> Any:
    return await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
    )


async def test_without_tenants_no_key_is_checked_and_no_ratelimit_headers_are_sent() -> None:
    async with gateway_with({}) as gateway:
        raw = await chat(openai_client(gateway, "anything"))
    assert raw.http_response.status_code == 200
    assert not any(name in raw.headers for name in RATELIMIT_HEADERS)


async def test_with_tenants_a_missing_or_unknown_key_is_a_401() -> None:
    async with gateway_with(
        {"tenants": {"acme": tenant(ACME_KEY, requests_per_minute=100)}}
    ) as gateway:
        with pytest.raises(openai.AuthenticationError) as unknown:
            await chat(openai_client(gateway, "sk-not-a-tenant"))
        response = await gateway.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}
        )
        missing = await response.json()
        assert (await chat(openai_client(gateway, ACME_KEY))).http_response.status_code == 200
    assert unknown.value.status_code == 401 and unknown.value.code == "invalid_api_key"
    assert response.status == 401 and missing["error"]["code"] == "invalid_api_key"


async def test_with_tenants_the_model_list_needs_a_tenants_key_and_charges_nothing() -> None:
    async with gateway_with({"tenants": {"acme": tenant(ACME_KEY, requests_per_minute=1)}}) as gw:
        with pytest.raises(openai.AuthenticationError) as unknown:
            await openai_client(gw, "sk-not-a-tenant").models.list()
        missing = await gw.get(f"/v1/models/{MODEL}")
        missing_code = (await missing.json())["error"]["code"]
        acme = openai_client(gw, ACME_KEY)
        listed = [model.id async for model in acme.models.list()]
        assert (await acme.models.retrieve(MODEL)).id == MODEL
        served = await chat(acme)  # the one request a minute is still there
    assert unknown.value.status_code == 401 and unknown.value.code == "invalid_api_key"
    assert missing.status == 401 and missing_code == "invalid_api_key"
    assert MODEL in listed and served.http_response.status_code == 200


async def test_allow_unknown_keys_serves_other_keys_unlimited() -> None:
    section = {
        "tenants": {"acme": tenant(ACME_KEY, requests_per_minute=1)},
        "allow_unknown_keys": True,
    }
    async with gateway_with(section) as gateway:
        stranger = openai_client(gateway, "sk-someone-else")
        answers = [await chat(stranger) for _ in range(3)]
    assert all(a.http_response.status_code == 200 for a in answers)
    assert not any(name in answers[0].headers for name in RATELIMIT_HEADERS)


async def test_over_the_request_limit_a_429_with_openais_body_and_headers() -> None:
    section = {
        "tenants": {"acme": tenant(ACME_KEY, requests_per_minute=2, tokens_per_minute=100_000)}
    }
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        first, second = await chat(client), await chat(client)
        with pytest.raises(openai.RateLimitError) as refused:
            await chat(client)

    # Successes carry the headers: the limit, what remains after this request, when it is full.
    assert first.headers[headers.RATELIMIT_LIMIT_REQUESTS] == "2"
    assert first.headers[headers.RATELIMIT_REMAINING_REQUESTS] == "1"
    assert second.headers[headers.RATELIMIT_REMAINING_REQUESTS] == "0"
    assert 55 < duration_s(second.headers[headers.RATELIMIT_RESET_REQUESTS]) <= 60
    assert first.headers[headers.RATELIMIT_LIMIT_TOKENS] == "100000"
    assert int(first.headers[headers.RATELIMIT_REMAINING_TOKENS]) < 100_000

    error = refused.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded" and error.type == "requests"
    assert "acme" in error.message and ACME_KEY not in error.message
    sent = error.response.headers
    # Two requests a minute refill one per 30 s: the third waits about 30 s.
    assert 25 <= int(sent[headers.RETRY_AFTER]) <= 30
    assert 25_000 <= int(sent[headers.RETRY_AFTER_MS]) <= 30_000
    assert sent[headers.RATELIMIT_REMAINING_REQUESTS] == "0"
    assert all(name in sent for name in RATELIMIT_HEADERS)
    assert sent[headers.REQUEST_ID]


async def test_over_the_token_limit_a_429_naming_tokens_while_other_tenants_are_served() -> None:
    section = {"tenants": {
        "acme": tenant(ACME_KEY, tokens_per_minute=300),
        "globex": tenant(GLOBEX_KEY, requests_per_minute=100),
    }}  # fmt: skip
    async with gateway_with(section) as gateway:
        acme = openai_client(gateway, ACME_KEY)
        await chat(acme, max_tokens=200)  # takes ~200 of 300 up front
        with pytest.raises(openai.RateLimitError) as refused:
            await chat(acme, max_tokens=200)
        other = await chat(openai_client(gateway, GLOBEX_KEY))
    assert refused.value.type == "tokens"
    assert headers.RATELIMIT_LIMIT_REQUESTS not in refused.value.response.headers  # no RPM set
    assert refused.value.response.headers[headers.RATELIMIT_LIMIT_TOKENS] == "300"
    assert other.http_response.status_code == 200


async def test_a_stream_carries_the_headers_and_its_reported_usage_is_what_is_counted() -> None:
    section = {
        "tenants": {"acme": tenant(ACME_KEY, requests_per_minute=5, tokens_per_minute=10_000)}
    }
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in raw.parse()]
        await asyncio.sleep(0.05)
        text = await (await gateway.get("/metrics")).text()
    assert raw.headers[headers.RATELIMIT_REMAINING_REQUESTS] == "4"
    assert int(raw.headers[headers.RATELIMIT_REMAINING_TOKENS]) < 10_000 - 50  # charged up front
    usage = next(c.usage for c in chunks if c.usage is not None)
    assert f'gateway_tenant_tokens_total{{tenant="acme"}} {float(usage.total_tokens)}' in text


# A tool whose schema names the usage's members: vLLM repeats the request's tools before its usage.
DECOY: Any = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "usage": {"input_tokens": 1, "total_tokens": 0}},
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_responses_api_request_is_charged_its_reported_usage(stream: bool) -> None:
    """Its own usage, not the members a request's tools may name alike (a tenant would be
    charged nothing, and the pool taught a prompt of one token)."""
    section = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=10_000)}}
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        asked: Any = {"model": MODEL, "input": "Where is my parcel?", "max_output_tokens": 50}
        if stream:
            events = await client.responses.create(**asked, tools=[DECOY], stream=True)
            [answer] = [e.response async for e in events if e.type == "response.completed"]
        else:
            answer = await client.responses.create(**asked, tools=[DECOY])
        await asyncio.sleep(0.05)
        text = await (await gateway.get("/metrics")).text()
    assert answer.usage is not None
    assert (
        f'gateway_tenant_tokens_total{{tenant="acme"}} {float(answer.usage.total_tokens)}' in text
    )


async def test_a_stream_without_usage_charged_many_buckets_blocks_the_next_for_a_minute_at_most() -> (
    None
):
    section = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=600)}}
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        # Estimated at 4 x 500 tokens and more, never corrected (no include_usage).
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=500,
            n=4,
            stream=True,
        )
        _ = [chunk async for chunk in stream]
        await asyncio.sleep(0.05)
        with pytest.raises(openai.RateLimitError) as refused:
            await chat(client, max_tokens=2)
    wait_s = int(refused.value.response.headers[headers.RETRY_AFTER])
    assert 55 <= wait_s <= 61  # one bucket's debt, refilling at 10 a second


async def test_a_request_the_replica_refuses_costs_no_tokens() -> None:
    section = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=1000)}}
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        with pytest.raises(openai.BadRequestError):  # longer than the sim's context
            await chat(client, max_tokens=1_000_000)
        await asyncio.sleep(0.05)  # the refund is settled off the request path
        after = await chat(client, max_tokens=8)
    # Admitted from the full bucket into debt, then refunded: the next sees a full bucket.
    assert int(after.headers[headers.RATELIMIT_REMAINING_TOKENS]) > 950


async def test_metrics_count_per_tenant_name_and_never_show_the_key() -> None:
    section = {"tenants": {"acme": tenant(ACME_KEY, requests_per_minute=1)}}
    async with gateway_with(section) as gateway:
        client = openai_client(gateway, ACME_KEY)
        raw = await chat(client, max_tokens=5)
        with pytest.raises(openai.RateLimitError):
            await chat(client)
        await asyncio.sleep(0.05)
        text = await (await gateway.get("/metrics")).text()
    used = raw.parse().usage.total_tokens
    assert 'gateway_tenant_requests_total{tenant="acme"} 1.0' in text
    assert 'gateway_tenant_rate_limited_total{limit="requests",tenant="acme"} 1.0' in text
    assert f'gateway_tenant_tokens_total{{tenant="acme"}} {float(used)}' in text
    assert ACME_KEY not in text and hash_key(ACME_KEY) not in text


async def test_limits_follow_a_policy_reload(tmp_path: Path) -> None:
    async with in_process_sims(1, decode_step_s=0.0) as urls:
        policy_file = tmp_path / "policy.yaml"
        one_rpm = limited_policy(urls, tenants={"acme": tenant(ACME_KEY, requests_per_minute=1)})
        policy_file.write_text(yaml.safe_dump(one_rpm))
        app = build_app(
            Settings.model_validate(
                {**FAST_PROBE_SETTINGS, "policy": policy_file, "admin_token": "adm"}
            ),
            parse_policy(one_rpm),
        )
        async with TestClient(TestServer(app, host="127.0.0.1")) as gateway:
            client = openai_client(gateway, ACME_KEY)
            await chat(client)
            with pytest.raises(openai.RateLimitError):
                await chat(client)
            # A new key for acme, and a higher limit: the old key stops working.
            new_key = "sk-acme-rotated"
            ten_rpm = limited_policy(
                urls, tenants={"acme": tenant(new_key, requests_per_minute=10)}
            )
            policy_file.write_text(yaml.safe_dump(ten_rpm))
            reload = await gateway.post("/admin/reload", headers={"Authorization": "Bearer adm"})
            assert reload.status == 200
            with pytest.raises(openai.AuthenticationError):
                await chat(client)
            raw = await chat(openai_client(gateway, new_key))
    assert raw.headers[headers.RATELIMIT_LIMIT_REQUESTS] == "10"


def _limiter(store: BucketStore) -> RateLimiter:
    registry = CollectorRegistry()
    counters = [
        Counter(name, "", labels, registry=registry)
        for name, labels in (("r", ["tenant"]), ("t", ["tenant"]), ("l", ["tenant", "limit"]))
    ]
    return RateLimiter(store, *counters)


def _acme(tokens_per_minute: int) -> Tenant:
    limits = TenantLimits(api_key_sha256=[hash_key(ACME_KEY)], tokens_per_minute=tokens_per_minute)
    return Tenant("acme", limits)


_USAGE_120 = b'{"usage": {"prompt_tokens": 20, "completion_tokens": 100, "total_tokens": 120}}'


async def test_the_token_estimate_is_corrected_by_the_reported_usage() -> None:
    limiter, acme = _limiter(LocalStore(clock=lambda: 0.0)), _acme(1000)
    admission: Admission = await limiter.admit(acme, tokens=500)
    assert admission.headers[headers.RATELIMIT_REMAINING_TOKENS] == "500"
    admission.observe(_USAGE_120)
    limiter.settle(admission, 200)
    await limiter.settled()
    after = await limiter.admit(acme, tokens=0)
    assert after.headers[headers.RATELIMIT_REMAINING_TOKENS] == "880"


class _AwayWhileAdmitting(LocalStore):
    """A store that does not answer a take (Redis away: the request is served unlimited),
    then answers again by the time the request's usage is settled."""

    away = False

    async def take(self, keys: Any, limits: Any, costs: Any) -> Verdict:
        if self.away:
            return None  # type: ignore[return-value]  # what RedisStore answers when away
        return await super().take(keys, limits, costs)


async def test_a_request_served_while_the_store_was_away_is_never_refunded() -> None:
    # Nothing was taken for it: a refund of its estimate would refill the bucket.
    store = _AwayWhileAdmitting(clock=lambda: 0.0)
    limiter, acme = _limiter(store), _acme(1000)
    spent = await limiter.admit(acme, tokens=900)
    assert spent.headers[headers.RATELIMIT_REMAINING_TOKENS] == "100"
    store.away = True
    unlimited = await limiter.admit(acme, tokens=20_000)
    store.away = False
    unlimited.observe(_USAGE_120)
    limiter.settle(unlimited, 200)
    await limiter.settled()
    after = await limiter.admit(acme, tokens=0)
    assert after.headers[headers.RATELIMIT_REMAINING_TOKENS] == "100"


class _RefusesShowingEnough(LocalStore):
    """A refusal whose views show the bucket just holding the cost: a figure rounded on its
    way back from a store."""

    async def take(self, keys: Any, limits: Any, costs: Any) -> Verdict:
        views = tuple(BucketView(lim.per_minute, lim.per_minute, 0.0) for lim in limits)
        return Verdict(False, (), views, retry_after_s=0.4)


async def test_a_refusal_is_a_429_even_where_no_bucket_shows_short() -> None:
    limiter = _limiter(_RefusesShowingEnough())
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(_acme(1200), tokens=1300)
    assert refused.value.status == 429
    assert refused.value.answer_headers()[headers.RETRY_AFTER] == "1"


async def test_with_leases_the_correction_stays_in_the_process() -> None:
    async with running_redis() as server:
        errors = Counter("errors", "", registry=CollectorRegistry())
        limiter, acme = _limiter(LeasedStore(RedisStore(server.url, errors), 0.5)), _acme(600_000)
        await limiter.admit(acme, tokens=500)  # and a lease of 5,000 tokens
        before = await script_calls(server.url)
        admission = await limiter.admit(acme, tokens=500)  # from the lease
        admission.observe(_USAGE_120)
        limiter.settle(admission, 200)
        await limiter.settled()
        after = await limiter.admit(acme, tokens=0)
        calls = await script_calls(server.url) - before
        await limiter.close()
    assert calls == 0  # neither the admissions from the lease nor the refund asked Redis
    remaining = int(after.headers[headers.RATELIMIT_REMAINING_TOKENS])
    assert remaining == pytest.approx(600_000 - 500 - 120, abs=2)


async def test_with_redis_down_tenants_are_served_unlimited_and_it_is_counted() -> None:
    section = {"tenants": {"acme": tenant(ACME_KEY, requests_per_minute=1)}}
    async with running_redis() as redis, gateway_with(section, redis_url=redis.url) as gateway:
        client = openai_client(gateway, ACME_KEY)
        first = await chat(client)
        with pytest.raises(openai.RateLimitError):
            await chat(client)  # the limit holds while Redis answers
        await redis.kill()
        served = [await chat(client) for _ in range(3)]
        text = await (await gateway.get("/metrics")).text()
    assert first.headers[headers.RATELIMIT_REMAINING_REQUESTS] == "0"
    assert all(s.http_response.status_code == 200 for s in served)
    assert not any(headers.RATELIMIT_LIMIT_REQUESTS in s.headers for s in served)
    assert "gateway_rate_limit_backend_errors_total 3.0" in text
