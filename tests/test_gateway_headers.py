"""What the replica receives from the gateway, and what the client gets back."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from gateway import headers
from tests.conftest import (
    MODEL,
    GatewayClient,
    chat,
    fake_replica,
    in_process_gateway,
    pool_policy,
)
from tests.hardening import read_answer
from tests.rate_limits import limited_policy, tenant


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


def raw_chat(*fields: bytes, chunked: bool = False) -> bytes:
    """A chat request with these header lines; ``chunked``, its body sent in chunks, which the
    front hands to aiohttp to read: either way the gateway must read the headers alike."""
    body = orjson.dumps(chat("system", "question"))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"".join(
        f + b"\r\n" for f in fields
    )
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


async def answer_to(gw: GatewayClient, request: bytes) -> int:
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    writer.write(request)
    status, _, _ = await read_answer(reader)
    writer.close()
    return status


@pytest.mark.parametrize("chunked", [False, True], ids=["framed by the front", "by aiohttp"])
async def test_header_bytes_that_are_not_ascii_reach_the_replica_as_sent(chunked: bool) -> None:
    seen: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers["Authorization"].encode(errors="surrogateescape"))
        return web.json_response({"ok": True})

    key = b"Bearer sk-t\xc3\xa9st-\xff"  # UTF-8 and a byte that is no UTF-8 at all
    async with fake_replica(record) as url, in_process_gateway(pool_policy([url])) as gw:
        request = raw_chat(
            b"Authorization: " + key, b"x-session-id: " + b"\xff" * 300, chunked=chunked
        )
        assert await answer_to(gw, request) == 200
    assert seen == [key]


@pytest.mark.parametrize("chunked", [False, True], ids=["framed by the front", "by aiohttp"])
async def test_a_tenants_key_and_the_routing_hints_read_the_same_however_the_request_is_framed(
    chunked: bool,
) -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async with fake_replica(ok) as url:
        policy = limited_policy([url], tenants={"t": tenant("sk-tést")})
        async with in_process_gateway(policy) as gw:
            bearer = b"Authorization: Bearer "
            assert (
                await answer_to(gw, raw_chat(bearer + "sk-tést".encode(), chunked=chunked)) == 200
            )
            assert await answer_to(gw, raw_chat(bearer + b"\xff\xfe", chunked=chunked)) == 401
            # Other scripts' digits are not a priority, whoever decodes the header.
            arabic_100 = "\u0661\u0660\u0660".encode()
            assert (
                await answer_to(
                    gw,
                    raw_chat(
                        bearer + "sk-tést".encode(),
                        b"x-gateway-priority: " + arabic_100,
                        chunked=chunked,
                    ),
                )
                == 400
            )


async def test_the_gateways_own_answers_carry_the_request_id_too() -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async with fake_replica(ok) as url, in_process_gateway(pool_policy([url])) as gw:
        for path in ("/v1/models", f"/v1/models/{MODEL}", "/health", "/ready", "/metrics"):
            async with gw.get(path, headers={headers.REQUEST_ID: "probe-7"}) as response:
                assert response.status == 200, path
                assert response.headers[headers.REQUEST_ID] == "probe-7", path
            async with gw.get(path) as response:
                assert len(response.headers[headers.REQUEST_ID]) >= 16, path


async def test_a_tiered_request_reaches_its_pool_as_the_client_wrote_it_but_for_the_model() -> None:
    raw_bodies: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        raw_bodies.append(await request.read())
        return web.json_response({"ok": True})

    # A number past 64 bits and a float's spelling would not survive a parse and a dump.
    body = (
        b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}],\n'
        b' "metadata": {"big": 123456789012345678901234567890, "f": 1.50}}'
    )
    async with fake_replica(record) as url:
        policy = {
            "pools": {
                "small": {"model": "small-m", "replicas": [url]},
                "large": {"model": "large-m", "replicas": [url]},
            },
            "tiers": {"auto": {"small": "small", "large": "large"}},
        }
        async with in_process_gateway(policy) as gw:
            async with gw.post("/v1/chat/completions", data=body) as response:
                assert response.status == 200
    [received] = raw_bodies
    assert received.startswith(body[:-1])
    assert json.loads(received)["model"] in ("small-m", "large-m")  # vLLM's parser: the last
