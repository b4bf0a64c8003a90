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

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway import headers
from gateway.http.completions import _settle_ended
from gateway.rate_limit import Admission, LocalStore, RateLimiter
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
