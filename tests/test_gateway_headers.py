"""What the replica receives from the gateway, and what the client gets back."""

from __future__ import annotations

import orjson
from aiohttp import web
from multidict import CIMultiDictProxy

from gateway import headers
from tests.conftest import chat, fake_replica, in_process_gateway, pool_policy


async def test_request_id_credentials_and_trace_context_reach_the_replica() -> None:
    seen: list[CIMultiDictProxy[str]] = []
    raw_bodies: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers)
        raw_bodies.append(await request.read())
        return web.json_response({"ok": True})

    body = orjson.dumps(chat("system", "question")) + b"  \n"  # odd whitespace: bytes pass as-is
    sent = {
        "Authorization": "Bearer sk-test",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x-request-id": "client-chosen-id",
        "x-internal-secret": "must-not-leak",
    }
    async with fake_replica(record) as url, in_process_gateway(pool_policy([url])) as gw:
        async with gw.post("/v1/chat/completions", data=body, headers=sent) as response:
            assert response.status == 200
            assert response.headers[headers.REQUEST_ID] == "client-chosen-id"
            assert response.headers[headers.REPLICA] == url.removeprefix("http://")
    [received] = seen
    assert received["Authorization"] == "Bearer sk-test"
    assert received["traceparent"] == sent["traceparent"]
    assert received["X-Request-Id"] == "client-chosen-id"
    assert "x-internal-secret" not in {k.lower() for k in received}
    assert raw_bodies == [body]


async def test_a_request_id_is_made_when_the_client_sends_none() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"id": request.headers["X-Request-Id"]})

    async with fake_replica(ok) as url, in_process_gateway(pool_policy([url])) as gw:
        async with gw.post("/v1/chat/completions", data=orjson.dumps(chat("s", "q"))) as response:
            made = response.headers[headers.REQUEST_ID]
            assert len(made) >= 16
            assert (await response.json())["id"] == made
