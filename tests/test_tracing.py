"""OpenTelemetry traces (GATEWAY_OTEL=true): a span per request with children for the routing
decision and the attempt at the replica, exported over OTLP/HTTP to the collector the OTEL_*
variables name, and the attempt's trace context sent to the replica in `traceparent`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from gateway.telemetry.tracing import (
    REQUEST_SPAN,
    ROUTE_SPAN,
    UPSTREAM_SPAN,
    Tracing,
    otlp_provider,
)
from tests.conftest import MODEL, chat, fake_replica, in_process_gateway, pool_policy

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
ANSWER = {
    "id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "traced"},
                 "finish_reason": "stop"}],
}  # fmt: skip


@asynccontextmanager
async def collector(expected: int) -> AsyncIterator[tuple[str, list[Any], asyncio.Event]]:
    """An OTLP/HTTP trace receiver (JSON, as the gateway exports): the spans every export
    carried, and an event set once ``expected`` have come."""
    spans: list[dict[str, Any]] = []
    arrived = asyncio.Event()

    async def receive(request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        for resource in (await request.json())["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                spans.extend(scope["spans"])
        if len(spans) >= expected:
            arrived.set()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/traces", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces", spans, arrived
    finally:
        await runner.cleanup()


async def test_a_request_is_traced_from_the_clients_context_to_the_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    async def replica(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent", ""))
        return web.json_response(ANSWER)

    async with collector(3) as (endpoint, spans, arrived), fake_replica(replica) as url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        async with in_process_gateway(pool_policy([url]), otel=True) as client:
            parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
            answer = await client.post(
                "/v1/chat/completions", json=chat("s", "u"), headers={"traceparent": parent}
            )
            assert answer.status == 200
            await asyncio.wait_for(arrived.wait(), 10)
    by_name = {span["name"]: span for span in spans}
    assert set(by_name) == {REQUEST_SPAN, ROUTE_SPAN, UPSTREAM_SPAN}
    request, route, upstream = (by_name[n] for n in (REQUEST_SPAN, ROUTE_SPAN, UPSTREAM_SPAN))
    # One trace, the client's: the request span is its child, the others the request's.
    assert {span["traceId"] for span in spans} == {CLIENT_TRACE}
    assert request["parentSpanId"] == CLIENT_SPAN
    assert route["parentSpanId"] == upstream["parentSpanId"] == request["spanId"]
    attributes = {a["key"]: a["value"] for a in route["attributes"]}
    assert attributes["llm_gateway.replica"]["stringValue"] == url.removeprefix("http://")
    assert attributes["llm_gateway.route"]["stringValue"] == answer.headers["x-gateway-route"]
    # The replica continues the attempt's span, not the client's.
    (sent,) = seen
    assert sent == f"00-{CLIENT_TRACE}-{upstream['spanId']}-01"


@pytest.mark.parametrize(("env", "name"), [({}, "llm-gateway"), ({"OTEL_SERVICE_NAME": "my-gw"}, "my-gw"), ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"}, "from-attrs")])  # fmt: skip
def test_the_service_name_is_the_otel_variables_else_llm_gateway(
    env: dict[str, str], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    assert otlp_provider().resource.attributes["service.name"] == name


async def test_a_collector_that_never_answers_does_not_hold_up_the_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await released.wait()
        return web.json_response({})

    async with fake_replica(hang, path="/v1/traces") as url:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{url}/v1/traces")
        tracing = Tracing(otlp_provider())
        with tracing.request({}, "small", "r1"):
            pass
        # The exporter retries for many seconds; the exit waits for it a moment only.
        started = time.monotonic()
        try:
            await tracing.close()
        finally:
            released.set()
        assert time.monotonic() - started < 3
