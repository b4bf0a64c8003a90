"""A non-streaming answer that breaks while the gateway holds it back (it relays one only once
whole, up to GATEWAY_MAX_BUFFERED_ANSWER_BYTES): nothing reached the client, so the attempt
fails over to another replica and counts towards the broken replica's ejection; one too long
to hold is cut short at the client and counts towards ejection all the same."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from gateway import headers
from tests.conftest import chat, get_text, metric
from tests.hardening import Counted, beside_two_good

HEAD = b'{"id":"chatcmpl-long","object":"chat.completion","choices":[{"message":{"content":"'


def breaks_its_json_answer(
    sent: bytes = b'{"id":"x"', then_stall: bool = False
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A replica's handler that answers 200 as JSON, promises 1000 bytes longer than ``sent``,
    sends ``sent`` and then dies (or, ``then_stall``, goes silent)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(sent) + 1000
        await response.prepare(request)
        await response.write(sent)
        if then_stall:
            await asyncio.sleep(5)  # past the read timeout the test sets
        assert request.transport is not None
        request.transport.close()
        return response

    return handler


async def post_statuses(url: str, n: int, avoid: str) -> list[int]:
    """The statuses of ``n`` chat requests; each answered one must come from a replica other
    than ``avoid``."""
    statuses = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            async with session.post(
                f"{url}/v1/chat/completions", data=orjson.dumps(chat("s", f"q{i}"))
            ) as response:
                body = await response.read()
                statuses.append(response.status)
                if response.status == 200:
                    assert response.headers[headers.REPLICA] != avoid
                    assert orjson.loads(body)["object"] == "chat.completion"
    return statuses


async def test_a_json_answer_that_breaks_before_it_is_relayed_is_retried_and_ejects_its_replica() -> (
    None
):
    # The gateway holds a non-streaming answer back until it is whole: nothing of the broken
    # one reached the client, so another replica can still answer it.
    bad = Counted(breaks_its_json_answer())
    async with beside_two_good(bad) as (gw, bad_name):
        statuses = await post_statuses(gw.url, 30, bad_name)
        _, text = await get_text(f"{gw.url}/metrics")
    assert statuses == [200] * 30
    assert bad.hits == 5  # GATEWAY_OUTLIER_CONSECUTIVE_FAILURES, then ejected
    assert metric(text, "gateway_retries_total", pool="small") == 5.0
    assert metric(text, "gateway_replica_ejected", replica=bad_name) == 1.0
    assert metric(text, "gateway_requests_total", pool="small", code="502") is None


async def test_a_json_answer_that_stalls_partway_is_retried_after_the_read_timeout() -> None:
    bad = Counted(breaks_its_json_answer(then_stall=True))
    env = {"GATEWAY_FIRST_BYTE_TIMEOUT_S": "0.5", "GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "2"}
    async with beside_two_good(bad, env) as (gw, bad_name):
        statuses = await post_statuses(gw.url, 9, bad_name)
        _, text = await get_text(f"{gw.url}/metrics")
    assert statuses == [200] * 9
    assert bad.hits == 2
    assert metric(text, "gateway_retries_total", pool="small") == 2.0
    assert metric(text, "gateway_replica_ejected", replica=bad_name) == 1.0


async def test_a_json_answer_too_long_to_hold_that_breaks_midway_counts_towards_ejection() -> None:
    # Past GATEWAY_MAX_BUFFERED_ANSWER_BYTES the answer's head is already with the client: it
    # can only be cut short, but its replica must not pass for a healthy one.
    bad = Counted(breaks_its_json_answer(HEAD + b"x" * (5 << 20)))
    env = {"GATEWAY_OUTLIER_CONSECUTIVE_FAILURES": "2"}
    async with beside_two_good(bad, env) as (gw, bad_name), aiohttp.ClientSession() as session:
        cut = 0
        for i in range(9):
            async with session.post(
                f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", f"q{i}"))
            ) as response:
                try:
                    await response.read()
                except aiohttp.ClientPayloadError:
                    cut += 1
        _, text = await get_text(f"{gw.url}/metrics")
        log = gw.log_tail(1 << 22)
    assert cut == bad.hits == 2
    assert metric(text, "gateway_replica_ejected", replica=bad_name) == 1.0
    assert metric(text, "gateway_requests_total", pool="small", code="502") == 2.0
    # A replica's broken answer is the replica's fault, logged as such, not the gateway's.
    assert "broke midway" in log
    assert "Traceback" not in log


async def hangs_up(request: web.Request) -> web.StreamResponse:
    """A replica's handler that closes the connection without a byte of answer."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


async def test_a_request_whose_last_attempt_failed_is_counted_under_the_route_it_took() -> None:
    # The 502 went through the routing like any other request: its series must sit beside the
    # pool's round-robin answers, not under the label of requests no pool was chosen for.
    bad = Counted(hangs_up)
    async with beside_two_good(bad, {"GATEWAY_RETRIES": "0"}) as (gw, _):
        async with aiohttp.ClientSession() as session:
            for i in range(3):
                async with session.post(
                    f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", f"q{i}"))
                ) as response:
                    await response.read()
        _, text = await get_text(f"{gw.url}/metrics")
    assert bad.hits == 1
    assert metric(text, "gateway_requests_total", route="round-robin", code="502") == 1.0
    assert metric(text, "gateway_requests_total", route="none", code="502") is None
