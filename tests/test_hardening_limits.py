"""Issue 8, abusive clients: slow or endless connections, hostile bodies, malformed HTTP, and
logs that name their request and never a secret."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import zlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import brotli
import orjson
import pytest
import pytest_asyncio
from multidict import CIMultiDict

from bench.launcher import start_gateway
from replica.processes import ManagedProcess
from tests.conftest import FAST_PROBES, MODEL, chat, pool_policy, running_sims
from tests.hardening import openai_error, raw_http, read_answer, wait_for_log

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "sk-very-secret-value"
ENV = {
    **FAST_PROBES,
    "GATEWAY_HEADER_TIMEOUT_S": "1",
    "GATEWAY_BODY_TIMEOUT_S": "1",
    "GATEWAY_MAX_CONNECTIONS": "20",
    "GATEWAY_LOG_LEVEL": "DEBUG",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway() -> AsyncIterator[ManagedProcess]:
    # The tier's large pool is an adapter of the same replica: a tier needs two pools.
    async with running_sims(
        1, prefill_s_per_token=0, decode_step_s=0, decode_s_per_seq=0, lora_modules="large-lora"
    ) as sims:
        policy = pool_policy([sims[0].url])
        policy["pools"]["large"] = {"model": "large-lora", "replicas": [sims[0].url]}
        policy["tiers"] = {"auto": {"small": "small", "large": "large"}}
        gw = await start_gateway(policy, env=ENV)
        try:
            yield gw
        finally:
            await gw.stop()


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "body",
    [
        chat("s", "q", tools=nested(300)),
        {"model": MODEL, "messages": [{"role": "user", "content": [nested(300)]}]},
        {"model": "auto", "messages": [{"role": "user", "content": "q"}], "x": nested(300)},
        # Beyond the JSON parser's own limit (1024), and Python's encoder's: written as text.
        b'{"model": "%s", "messages": [], "x": %s"x"%s}'
        % (MODEL.encode(), b"[" * 2000, b"]" * 2000),
    ],
    ids=["tools", "content-part", "tiered-model", "past-the-parsers-limit"],
)
async def test_deep_nesting_is_a_400_naming_it_and_no_traceback(
    gateway: ManagedProcess, body: dict[str, object] | bytes
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/v1/chat/completions", data=data) as response,
    ):
        assert response.status == 400
        error = openai_error(await response.read())
        assert (error["param"], error["code"]) == ("body", "too_deeply_nested")
    assert "Traceback" not in gateway.log_tail(1 << 22)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", "10"), ("max_tokens", -1), ("n", 1.5), ("stream", "yes"), ("tools", {}),
     ("temperature", "hot"), ("cache_salt", 3), ("max_completion_tokens", True)],
)  # fmt: skip
async def test_fields_the_gateway_reads_are_typed(
    gateway: ManagedProcess, field: str, value: object
) -> None:
    for model in (MODEL, "auto"):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gateway.url}/v1/chat/completions",
                data=orjson.dumps({**chat("s", "q", model=model), field: value}),
            ) as response,
        ):
            assert response.status == 400
            assert "x-gateway-replica" not in response.headers  # the gateway's own answer
            assert openai_error(await response.read())["param"] == field


async def test_a_body_that_is_not_the_gzip_it_claims_is_a_400(gateway: ManagedProcess) -> None:
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=b"not gzip at all", headers=headers
        ) as response:
            assert response.status == 400
            assert openai_error(await response.read())["code"] == "invalid_content_encoding"
        real = gzip.compress(orjson.dumps(chat("s", "q")))
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=real, headers=headers
        ) as response:
            assert response.status == 200  # a real gzip body is fine


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
async def test_a_body_in_each_coding_the_contract_names_is_read(
    gateway: ManagedProcess, coding: str
) -> None:
    raw = orjson.dumps(chat("s", "q"))
    compress = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "br": brotli.compress,
        "zstd": zstd.compress,
    }[coding]
    headers = {"Content-Encoding": coding, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.url}/v1/chat/completions", data=compress(raw), headers=headers
        ) as response,
    ):
        assert response.status == 200


@pytest.mark.parametrize(
    "lines", [["bogus"], ["gzip, identity"], ["identity, gzip"], ["gzip", "identity"]]
)
async def test_a_body_in_a_coding_the_gateway_cannot_read_is_a_415_naming_it(
    gateway: ManagedProcess, lines: list[str]
) -> None:
    # Read as it came, a gzip body listed with identity would be "not valid JSON", and a coding
    # nobody knows would be parsed as if it were none. Two header lines are a list too.
    headers = CIMultiDict([("Content-Encoding", line) for line in lines])
    headers["Content-Type"] = "application/json"
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/v1/chat/completions",
            data=gzip.compress(orjson.dumps(chat("s", "q"))),
            headers=headers,
        ) as response:
            assert response.status == 415
            error = openai_error(await response.read())
            assert (error["code"], error["param"]) == (
                "unsupported_content_encoding",
                "Content-Encoding",
            )


async def test_a_client_still_uploading_when_its_body_times_out_is_not_reset(
    gateway: ManagedProcess,
) -> None:
    # Closed at once, the connection would answer the bytes still coming with a reset, which
    # can destroy the 408 before the client reads it (a reset drops what is unsent or unread).
    parts = urlsplit(gateway.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100000\r\n\r\n{"model":'
    )
    async with asyncio.timeout(5):
        status, _, body = await read_answer(reader)  # past GATEWAY_BODY_TIMEOUT_S
        assert (status, openai_error(body)["code"]) == (408, "request_timeout")
        for _ in range(3):  # the upload goes on, read and dropped: no reset comes back
            writer.write(b" " * 4096)
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write_eof()
        assert await reader.read() == b""  # then closed
    writer.close()


async def test_a_connection_without_complete_headers_is_closed(gateway: ManagedProcess) -> None:
    parts = urlsplit(gateway.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # closed by the gateway
    assert asyncio.get_running_loop().time() - started < 3
    writer.close()


async def test_a_body_that_does_not_arrive_gets_408_with_the_requests_id(
    gateway: ManagedProcess,
) -> None:
    status, head, body = await raw_http(
        gateway.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'X-Request-Id: slow-upload-1\r\nContent-Length: 500\r\n\r\n{"model":',
    )
    assert status == 408
    assert openai_error(body)["code"] == "request_timeout"
    assert b"\r\nx-request-id: slow-upload-1\r\n" in head.lower()


async def test_connections_over_the_limit_are_refused_clearly_and_others_go_on(
    gateway: ManagedProcess,
) -> None:
    parts = urlsplit(gateway.url)
    held = [await asyncio.open_connection(parts.hostname, parts.port) for _ in range(20)]
    try:
        await asyncio.sleep(0.2)
        status, head, body = await raw_http(gateway.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503
        assert openai_error(body)["code"] == "too_many_connections"
        assert b"\r\nx-request-id: " in head.lower()  # as on every answer
    finally:
        for _, writer in held:
            writer.close()
    await asyncio.sleep(0.3)
    status, _, _ = await raw_http(gateway.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200
    log = await wait_for_log(gateway, "refused")
    assert "GATEWAY_MAX_CONNECTIONS is 20" in log


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization Bearer " + SECRET.encode()
        + b"\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode()
        + b"x" * 9000 + b"\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: tea\r\n\r\n{}",
    ],
    ids=["garbage", "no-colon", "over-8190", "expect"],
)  # fmt: skip
async def test_malformed_http_gets_an_openai_error_and_leaks_nothing_to_the_log(
    gateway: ManagedProcess, request_bytes: bytes
) -> None:
    status, head, body = await raw_http(gateway.url, request_bytes)
    assert 400 <= status < 500
    assert b"application/json" in head
    assert b"\r\nx-request-id: " in head.lower()  # as on every answer
    openai_error(body)
    log = await wait_for_log(gateway, "answered")
    assert SECRET not in log


async def test_log_lines_carry_the_request_id_and_never_the_credentials(
    gateway: ManagedProcess,
) -> None:
    long_bad_id = "bad id with spaces " + "x" * 300
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/v1/chat/completions",
            data=orjson.dumps(chat("s", "q")),
            headers={"x-request-id": "rid-4242", "Authorization": f"Bearer {SECRET}"},
        ) as response:
            assert response.status == 200
            assert response.headers["x-request-id"] == "rid-4242"
        async with session.post(
            f"{gateway.url}/v1/chat/completions",
            data=orjson.dumps(chat("s", "q")),
            headers={"x-request-id": long_bad_id},
        ) as response:
            assert response.headers["x-request-id"] != long_bad_id  # not echoed into logs
    log = await wait_for_log(gateway, "[rid-4242]")
    [line] = [line for line in log.splitlines() if "[rid-4242]" in line]
    assert "answered 200" in line
    assert SECRET not in log and long_bad_id not in log


async def test_a_request_handed_to_aiohttp_after_a_completion_logs_under_its_own_id(
    gateway: ManagedProcess,
) -> None:
    parts = urlsplit(gateway.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    body = orjson.dumps(chat("s", "q"))
    completion = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: rid-before\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    # Handed over behind the completion: a request aiohttp answers, then one it logs as bad.
    writer.write(completion + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nBAD\x01 / HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(5):
        while await reader.read(65536):
            pass
    writer.close()
    log = await wait_for_log(gateway, "(BadHttpMethod)")
    malformed = [line for line in log.splitlines() if "(BadHttpMethod)" in line]
    assert malformed and not [line for line in malformed if "[rid-before]" in line]
