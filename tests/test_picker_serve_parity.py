"""What the picker counts, `serve` counts alike: a stream its client read to `data: [DONE]` and
closed before the chunked body's end (the sync OpenAI SDK does) is the replica's answer, not a
client that left (tests/test_picker_grpc.py has the picker's side)."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from tests.conftest import (
    MODEL,
    chat,
    eventually,
    fake_replica,
    in_process_gateway,
    metric_sum,
    pool_policy,
)

CHUNK = {
    "id": "c",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": MODEL,
    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
}


async def test_serve_counts_a_stream_read_to_its_end_as_the_replicas_status() -> None:
    held = asyncio.Event()

    async def done_then_holds(request: web.Request) -> web.StreamResponse:
        """The whole stream, its `[DONE]` included, then a body that has not ended yet: the
        client's close lands before the chunked end, as it may on any stream."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(CHUNK) + b"\n\ndata: [DONE]\n\n")
        await held.wait()
        return response

    async with (
        fake_replica(done_then_holds) as replica,
        in_process_gateway(pool_policy([replica])) as gateway,
    ):
        try:
            url = str(gateway.make_url(""))
            body = chat("You are brief.", "hello", stream=True)
            async with gateway.post("/v1/chat/completions", json=body) as answer:
                assert answer.status == 200
                async for line in answer.content:
                    if line.strip() == b"data: [DONE]":
                        break  # and close, as the sync SDK does

            async def counted() -> bool:
                return await metric_sum(url, "gateway_requests_total", pool="small") == 1

            assert await eventually(counted)
            assert await metric_sum(url, "gateway_requests_total", code="200") == 1
        finally:
            held.set()  # the replica's handler ends: its server stops without waiting on it
