"""The front (gateway/http/front.py): completion requests served at the protocol level, any other
request handed to aiohttp with the connection's bytes as they came, on one keep-alive
connection, pipelined or split into small writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httptools
import orjson
import pytest
import pytest_asyncio

from gateway import headers
from gateway.http import front
from tests.conftest import MODEL, GatewayClient, in_process_gateway, in_process_sims
from tests.hardening import read_answer

pytestmark = pytest.mark.asyncio(loop_scope="module")

BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
GET_MODELS = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway() -> AsyncIterator[GatewayClient]:
    async with in_process_sims(1) as [replica]:
        policy = {"pools": {"small": {"model": MODEL, "replicas": [replica]}}}
        async with in_process_gateway(policy) as client:
            yield client


async def connect(
    gateway: GatewayClient,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(gateway.host, gateway.port)


async def test_a_completion_is_answered_with_its_length_date_and_routing_headers(
    gateway: GatewayClient,
) -> None:
    reader, writer = await connect(gateway)
    writer.write(POST)
    status, fields, body = await read_answer(reader)
    writer.close()
    assert status == 200
    assert orjson.loads(body)["object"] == "chat.completion"
    assert fields["content-type"].startswith("application/json")
    assert "date" in fields and fields[headers.REPLICA.lower()]
    assert fields[headers.REQUEST_ID.lower()]


async def test_one_connection_serves_completions_around_a_request_aiohttp_answers(
    gateway: GatewayClient,
) -> None:
    reader, writer = await connect(gateway)
    answers = []
    for request in (POST, GET_MODELS, POST):
        writer.write(request)
        answers.append(await read_answer(reader))
    writer.close()
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert orjson.loads(answers[1][2])["object"] == "list"
    assert orjson.loads(answers[2][2])["object"] == "chat.completion"


async def test_header_values_read_alike_whichever_side_serves_the_request(
    gateway: GatewayClient,
) -> None:
    # aiohttp strips a value's trailing white space; the front must too, or a request id, a
    # session key or a tier header would read otherwise after the connection changes hands.
    spaced = POST.replace(b"Host: x\r\n", b"Host: x\r\nX-Request-Id: id-1 \t\r\n")
    reader, writer = await connect(gateway)
    ids = []
    for request in (spaced, GET_MODELS, spaced):  # the front's, then aiohttp's from then on
        writer.write(request)
        ids.append((await read_answer(reader))[1].get(headers.REQUEST_ID.lower()))
    writer.close()
    assert ids[0] == ids[2] == "id-1"


async def test_pipelined_requests_are_answered_in_order(gateway: GatewayClient) -> None:
    reader, writer = await connect(gateway)
    writer.write(POST + POST + GET_MODELS)
    kinds = [orjson.loads((await read_answer(reader))[2])["object"] for _ in range(3)]
    writer.close()
    assert kinds == ["chat.completion", "chat.completion", "list"]


async def test_a_request_written_a_few_bytes_at_a_time_is_answered(
    gateway: GatewayClient,
) -> None:
    reader, writer = await connect(gateway)
    for i in range(0, len(POST), 7):
        writer.write(POST[i : i + 7])
        await writer.drain()
        await asyncio.sleep(0)
    status, _, body = await read_answer(reader)
    writer.close()
    assert status == 200 and orjson.loads(body)["object"] == "chat.completion"


async def test_a_body_arriving_in_pieces_has_its_head_parsed_once_not_once_a_piece(
    gateway: GatewayClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A parse per piece would make a slow upload of a large head cost the loop per packet.
    parses = 0
    parser = httptools.HttpRequestParser

    def counted(head: object) -> httptools.HttpRequestParser:
        nonlocal parses
        parses += 1
        return parser(head)

    monkeypatch.setattr(httptools, "HttpRequestParser", counted)  # as the front finds it
    head_end = POST.index(b"\r\n\r\n") + 4
    reader, writer = await connect(gateway)
    writer.write(POST[:head_end])
    for i in range(head_end, len(POST), 3):
        await asyncio.sleep(0.01)  # each piece read on its own
        writer.write(POST[i : i + 3])
        await writer.drain()
    status, _, _ = await read_answer(reader)
    writer.close()
    assert status == 200
    assert parses == 2  # the head when it came, and once the body was in


async def test_a_chunked_body_and_an_expectation_go_to_aiohttp_and_are_served(
    gateway: GatewayClient,
) -> None:
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    )
    reader, writer = await connect(gateway)
    writer.write(chunked)
    assert (await read_answer(reader))[0] == 200
    writer.close()
    reader, writer = await connect(gateway)
    writer.write(POST.replace(b"Host: x\r\n", b"Host: x\r\nExpect: 100-continue\r\n"))
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_open_connections_are_counted_once_whoever_serves_them(
    gateway: GatewayClient,
) -> None:
    async def open_now() -> float:
        async with gateway.get("/metrics") as response:
            text = await response.text()
        line = next(x for x in text.splitlines() if x.startswith("gateway_client_connections "))
        return float(line.split()[1])

    before = await open_now()
    held = [await connect(gateway) for _ in range(3)]
    plans = ((POST, 1), (GET_MODELS, 1), (POST + GET_MODELS, 2))  # front, aiohttp, both
    for (request, answers), (reader, writer) in zip(plans, held, strict=True):
        writer.write(request)
        for _ in range(answers):
            await read_answer(reader)
    assert await open_now() == before + 3
    for _, writer in held:
        writer.close()
    for _ in range(50):
        if await open_now() == before:
            break
        await asyncio.sleep(0.02)
    assert await open_now() == before


async def test_a_long_stream_read_slowly_arrives_whole_and_its_replica_connection_is_reused() -> (
    None
):
    zero: dict[str, Any] = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
    async with (
        in_process_sims(1, **zero) as [replica],
        in_process_gateway({"pools": {"p": {"model": MODEL, "replicas": [replica]}}}) as gw,
    ):
        body = orjson.dumps(
            {"model": MODEL, "stream": True, "max_tokens": 4000,
             "messages": [{"role": "user", "content": "hi"}]}
        )  # fmt: skip
        request = POST.replace(b"%d\r\n\r\n" % len(BODY), b"%d\r\n\r\n" % len(body))
        reader, writer = await connect(gw)
        writer.write(request.replace(BODY, body))
        await asyncio.sleep(0.5)  # ~600 KB of events pile up against an unread socket
        raw = b""
        while not raw.endswith(b"0\r\n\r\n"):
            raw += await reader.read(4096)
            await asyncio.sleep(0)
        writer.close()
        assert raw.count(b"data: ") > 4000 and b"data: [DONE]" in raw
        # The replica connection went back to the pool reading, not paused by the slow client.
        async with asyncio.timeout(5):
            async with gw.post("/v1/chat/completions", data=BODY) as answer:
                assert answer.status == 200


EMPTY_POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"), [(POST, 200), (EMPTY_POST, 400)], ids=["completion", "empty body"]
)
async def test_a_client_asking_to_close_gets_its_answer_then_the_close(
    gateway: GatewayClient, request_bytes: bytes, status: int
) -> None:
    reader, writer = await connect(gateway)
    writer.write(request_bytes.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
    got, fields, _ = await read_answer(reader)
    assert (got, fields.get("connection")) == (status, "close")
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # closed by the gateway
    writer.close()


UPGRADE = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"


async def answer_within(
    reader: asyncio.StreamReader, seconds: float = 3
) -> tuple[int, dict[str, str], bytes]:
    async with asyncio.timeout(seconds):
        return await read_answer(reader)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (POST.replace(b"Host: x\r\n", b"Host: x\r\n" + UPGRADE), 200),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + UPGRADE + b"\r\n", 200),
        (
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            200,
        ),
        (b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n", 404),
    ],
    ids=["h2c-completion", "h2c-health", "websocket", "connect"],
)
async def test_requests_to_upgrade_or_connect_are_answered_by_aiohttp_as_it_would(
    gateway: GatewayClient, request_bytes: bytes, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    # curl --http2 asks for h2c on http://; an HTTPS_PROXY pointed at the gateway sends CONNECT.
    reader, writer = await connect(gateway)
    writer.write(request_bytes)
    got, _, _ = await answer_within(reader)
    writer.close()
    assert got == status
    assert "could not frame" not in caplog.text  # an upgrade is no failure of the front


async def test_a_request_to_upgrade_pipelined_behind_a_completion_is_answered_too(
    gateway: GatewayClient, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(gateway)
    writer.write(POST + POST.replace(b"Host: x\r\n", b"Host: x\r\n" + UPGRADE))
    answers = [await answer_within(reader) for _ in range(2)]
    writer.close()
    assert [status for status, _, _ in answers] == [200, 200]
    assert "could not frame" not in caplog.text


async def test_a_failure_of_the_front_itself_hands_the_connection_to_aiohttp(
    gateway: GatewayClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> int:
        raise RuntimeError("a bug in framing")

    monkeypatch.setattr(front, "framed_body_length", broken)
    reader, writer = await connect(gateway)
    writer.write(POST + POST)  # the first framed in data_received, the second after an answer
    answers = [await answer_within(reader) for _ in range(2)]
    writer.close()
    assert [status for status, _, _ in answers] == [200, 200]
    assert "a bug in framing" in caplog.text


async def test_a_content_length_too_long_to_be_a_number_is_aiohttps_to_refuse(
    gateway: GatewayClient, caplog: pytest.LogCaptureFixture
) -> None:
    # llhttp reads leading zeros, int() refuses 4,300 digits and more: no failure of the front.
    reader, writer = await connect(gateway)
    writer.write(
        POST.replace(b"Content-Length: %d" % len(BODY), b"Content-Length: " + b"0" * 5000 + b"2")
    )
    status, _, _ = await answer_within(reader)
    writer.close()
    assert status in (400, 413)
    assert "could not frame" not in caplog.text


@pytest.mark.parametrize(
    "head",
    [
        POST.replace(b"Host: x\r\n", b""),
        POST.replace(b"Host: x\r\n", b"Host: x\r\nHost: y\r\n"),
        POST.replace(b"Content-Type: application/json\r\n", b"Content-Type: a/b\r\n" * 2),
    ],
    ids=["no-host", "two-hosts", "two-content-types"],
)
async def test_a_request_aiohttp_refuses_is_refused_whoever_frames_it(
    gateway: GatewayClient, head: bytes
) -> None:
    # RFC 9112: a request without Host, or with two, gets a 400; aiohttp's parser says so.
    reader, writer = await connect(gateway)
    writer.write(head)
    status, _, _ = await answer_within(reader)
    writer.close()
    assert status == 400


TLS_CLIENT_HELLO = bytes.fromhex("160301020001") + b"\x03\x03" + bytes(32)


@pytest.mark.parametrize(
    "request_bytes",
    [
        TLS_CLIENT_HELLO,
        b"GET /health HTTP/1.1\nHost: x\n\n",
        b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
        b"GARBAGE",
    ],
    ids=["https-client", "bare-lf-get", "bare-lf-post", "garbage"],
)
async def test_bytes_that_cannot_be_a_completion_are_answered_at_once_not_at_the_timeout(
    gateway: GatewayClient, request_bytes: bytes
) -> None:
    reader, writer = await connect(gateway)
    writer.write(request_bytes)
    async with asyncio.timeout(3):  # the header timeout is 30 s
        answer = await reader.read()
    writer.close()
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))


def with_fields(fields: bytes) -> bytes:
    return POST.replace(b"Host: x\r\n", b"Host: x\r\n" + fields)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (with_fields(b"X-Big: " + b"a" * 9000 + b"\r\n"), 400),
        (with_fields(b"Authorization: Bearer " + b"a" * 100_000 + b"\r\n"), 400),
        (with_fields(b"".join(b"X-H%d: v\r\n" % i for i in range(200))), 400),
        (with_fields(b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 7000) for i in range(3))), 200),
    ],
    ids=["9-kb-field", "100-kb-field", "200-fields", "20-kb-head-of-small-fields"],
)
@pytest.mark.parametrize("served_by", ["front", "aiohttp"])
async def test_a_head_gets_aiohttps_limits_whoever_frames_it_and_however_it_arrives(
    gateway: GatewayClient, request_bytes: bytes, status: int, served_by: str
) -> None:
    reader, writer = await connect(gateway)
    if served_by == "aiohttp":
        writer.write(GET_MODELS)  # handed over: aiohttp frames the rest of the connection
        await read_answer(reader)
    writer.write(request_bytes)  # in one write: the front sees the whole head at once
    got, _, body = await answer_within(reader)
    writer.close()
    assert got == status
    if status != 200:
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
