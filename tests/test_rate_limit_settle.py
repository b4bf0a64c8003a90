"""A request's token charge is settled however the request ends: also when its client leaves
mid-answer (the front then cancels the request), by the usage seen if any, else by its
estimate (the tokens may well have been generated: a refund would make leaving just before the
usage event a way round the limit); and a settlement that fails never hides what ended the
request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from http import HTTPStatus

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway import headers
from gateway.http.completions import _settle_ended
from gateway.http.request_body import Endpoint, ParsedRequest, parse_request
from gateway.rate_limit import Admission, LocalStore, RateLimiter, hash_key
from gateway.rate_limit.limiter import RateLimited, Tenant, estimate_tokens
from router_policies.limits_settings import TenantLimits
from router_policies.rate_limit import Limit
from tests.conftest import (
    MODEL,
    GatewayClient,
    eventually,
    in_process_gateway,
    in_process_sims,
    metric,
    pool_policy,
)
from tests.rate_limits import ACME_KEY, MESSAGES, limited_policy, tenant

AUTH = {"Authorization": f"Bearer {ACME_KEY}"}


async def _remaining_tokens(gateway: GatewayClient) -> int:
    probe = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    async with gateway.post("/v1/chat/completions", json=probe, headers=AUTH) as answer:
        await answer.read()
        return int(answer.headers[headers.RATELIMIT_REMAINING_TOKENS])


async def test_a_client_that_leaves_mid_stream_is_charged_its_estimate_and_counted() -> None:
    section = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=10_000)}}
    async with (
        in_process_sims(1, decode_step_s=0.05) as urls,
        in_process_gateway(limited_policy(urls, **section)) as gateway,
    ):
        # 5,000 tokens at 50 ms each: minutes of stream, its usage due only at the end.
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5000, "stream": True}
        response = await gateway.post("/v1/chat/completions", json=body, headers=AUTH)
        assert int(response.headers[headers.RATELIMIT_REMAINING_TOKENS]) < 5000  # charged
        await response.content.readline()  # the stream has started
        response.close()  # the client leaves

        async def counted() -> bool:
            async with gateway.get("/metrics") as answer:
                text = await answer.text()
            return (metric(text, "gateway_tenant_tokens_total", tenant="acme") or 0) >= 5000

        assert await eventually(counted)
        assert await _remaining_tokens(gateway) < 6_000  # not refunded


async def test_a_client_that_leaves_while_its_request_is_queued_is_refunded() -> None:
    # Nothing was generated for it: charging would bill tenants for giving up under overload.
    section = {"tenants": {"acme": tenant(ACME_KEY, tokens_per_minute=10_000)}}
    async with in_process_sims(1, decode_step_s=0.05) as urls:
        policy = {**pool_policy(urls, max_inflight_per_replica=1), "limits": section}
        async with in_process_gateway(policy) as gateway:
            body = {"model": MODEL, "messages": MESSAGES, "stream": True}
            busy = await gateway.post(
                "/v1/chat/completions", json={**body, "max_tokens": 2000}, headers=AUTH
            )
            await busy.content.readline()  # holds the replica's one slot
            queued = asyncio.create_task(
                gateway.post(
                    "/v1/chat/completions", json={**body, "max_tokens": 6000}, headers=AUTH
                )
            )
            await asyncio.sleep(0.3)  # in the gateway's queue: the slot is taken
            queued.cancel()  # the client leaves before a replica was asked
            with contextlib.suppress(asyncio.CancelledError):
                await queued
            busy.close()  # leaves mid-stream: charged its ~2,000
            # Charged for both, ~1,900 would be left; the queued one refunded, ~7,900.
            assert await _remaining_tokens(gateway) > 6_000


def _limiter(store: LocalStore) -> tuple[RateLimiter, Tenant]:
    registry = CollectorRegistry()
    requests, tokens, limited = (
        Counter(name, "", labels, registry=registry)
        for name, labels in (("r", ["tenant"]), ("t", ["tenant"]), ("l", ["tenant", "limit"]))
    )
    limits = TenantLimits(api_key_sha256=[hash_key(ACME_KEY)], tokens_per_minute=10_000)
    return RateLimiter(store, requests, tokens, limited), Tenant("acme", limits)


async def test_an_estimate_past_two_buckets_is_corrected_from_what_the_bucket_took() -> None:
    # Admitted from a full bucket, it takes two buckets at most (the debt's bound): a refund
    # from the whole estimate would leave the bucket full after 9,000 tokens were used.
    limiter, acme = _limiter(LocalStore(clock=lambda: 1000.0))
    admission = await limiter.admit(acme, 32_000)
    admission.reported_tokens = 9_000
    limiter.settle(admission, 200)
    with pytest.raises(RateLimited):
        await limiter.admit(acme, 2_000)  # 1,000 left
    assert (await limiter.admit(acme, 1_000)).tokens_charged == 1_000


def _parsed(endpoint: Endpoint, **body: object) -> ParsedRequest:
    return parse_request(endpoint, orjson.dumps({"model": "m", **body}))


CHAT = {"messages": MESSAGES}
ESTIMATES = {
    # vLLM's order: max_completion_tokens over max_tokens on chat, max_output_tokens on
    # responses; a field another endpoint uses is not read.
    "chat, both budgets": (_parsed(Endpoint.CHAT, **CHAT, max_tokens=1, max_completion_tokens=300), 300),
    "chat, another endpoint's field": (_parsed(Endpoint.CHAT, **CHAT, max_output_tokens=10**9), 256),
    "responses": (_parsed(Endpoint.RESPONSES, input="hi", max_tokens=1, max_output_tokens=300), 300),
    "completions, n choices": (_parsed(Endpoint.COMPLETIONS, prompt="hi", max_tokens=300, n=2), 600),
    "completions, a batch of prompts": (
        _parsed(Endpoint.COMPLETIONS, prompt=["hi"] * 10, max_tokens=300), 3_000,
    ),
    "completions, a batch of token lists": (
        _parsed(Endpoint.COMPLETIONS, prompt=[[1, 2]] * 3, max_tokens=100, n=2), 600,
    ),
    "completions, one tokenized prompt": (_parsed(Endpoint.COMPLETIONS, prompt=[1, 2], max_tokens=7), 7),
}  # fmt: skip


@pytest.mark.parametrize(("parsed", "answer"), ESTIMATES.values(), ids=ESTIMATES.keys())
def test_the_estimate_counts_the_answer_budget_vllm_reads_for_every_choice_of_every_prompt(
    parsed: ParsedRequest, answer: int
) -> None:
    assert estimate_tokens(parsed, 40, 4.0, 256) == 10 + answer  # 40 bytes at 4 a token


def test_a_settlement_that_fails_is_logged_and_never_raised_over_what_ended_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenStore(LocalStore):
        def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
            raise RuntimeError("a bug in the store")

    registry = CollectorRegistry()
    requests, tokens, limited = (
        Counter(name, "", labels, registry=registry)
        for name, labels in (("r", ["tenant"]), ("t", ["tenant"]), ("l", ["tenant", "limit"]))
    )
    limiter = RateLimiter(BrokenStore(), requests, tokens, limited)
    admission = Admission("acme", {}, tokens.labels("acme"), 500.0, Limit(1000))
    with caplog.at_level(logging.ERROR, logger="gateway.http.completions"):
        # A failed request's refund, which the store fails to write: logged, and it returns
        # (the exception that ended the request goes on up).
        _settle_ended(limiter, admission, HTTPStatus.INTERNAL_SERVER_ERROR)
    assert "a request that ended early failed" in caplog.text
