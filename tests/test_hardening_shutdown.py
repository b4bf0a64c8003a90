"""Issue 8, stopping: SIGTERM turns /ready 503 at once, keeps serving for the pre-stop delay,
drains up to a deadline, and ends what is left with an error the client can read."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from bench.launcher import start_gateway
from replica.processes import ManagedProcess
from tests.conftest import chat, fake_replica, pool_policy, running_gateway, running_sims
from tests.hardening import (
    long_stream_under_way,
    openai_error,
    read_answer,
    starting_against_a_silent_replica,
)


async def test_sigterm_readiness_first_then_a_bounded_drain() -> None:
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "1.5", "GATEWAY_DRAIN_TIMEOUT_S": "1.5"}
    async with long_stream_under_way(env) as (gw, session, response):
        os.kill(gw.pid, signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.sleep(0.2)
        async with session.get(f"{gw.url}/ready") as ready:
            assert ready.status == 503
            assert (await ready.json())["draining"] is True
        # Still accepted during the pre-stop delay: the load balancer may not know yet.
        async with session.post(
            f"{gw.url}/v1/chat/completions", data=orjson.dumps(chat("s", "quick", max_tokens=2))
        ) as quick:
            assert quick.status == 200

        rest = await response.content.read()  # ends at the drain deadline, with an error event
        ended = time.monotonic() - signalled
        assert b'"code":"shutting_down"' in rest and rest.rstrip().endswith(b"data: [DONE]")
        assert 2.5 < ended < 6
        # It exits by itself: polled, since a second SIGTERM (stop()) could land after the
        # handlers are gone and end it by the signal instead.
        async with asyncio.timeout(5):
            while gw.returncode is None:  # noqa: ASYNC110 (a child's exit is no Event)
                await asyncio.sleep(0.05)
        assert gw.returncode == 0


async def test_a_request_still_waiting_at_the_drain_deadline_is_refused_as_any_refusal() -> None:
    """Its 503 names its pool, as the gateway's other refusals once the pool is chosen do."""
    answered = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await answered.wait()  # a prefill that outlasts the drain
        return web.json_response({})

    env = {"GATEWAY_SHUTDOWN_DELAY_S": "0.2", "GATEWAY_DRAIN_TIMEOUT_S": "0.5"}
    async with (
        fake_replica(silent) as url,
        running_gateway([url], "round-robin", env=env) as gw,
        aiohttp.ClientSession() as session,
    ):
        try:
            body = orjson.dumps(chat("s", "q", max_tokens=2))
            waiting = asyncio.create_task(session.post(f"{gw.url}/v1/chat/completions", data=body))
            await asyncio.sleep(0.3)  # in flight at the replica
            os.kill(gw.pid, signal.SIGTERM)
            async with asyncio.timeout(10):
                refused = await waiting
                error = await refused.json()
        finally:
            answered.set()
    assert refused.status == 503 and error["error"]["code"] == "shutting_down"
    assert refused.headers["x-gateway-pool"] == "small"
    assert refused.headers["x-request-id"]


async def test_a_gateway_the_launcher_started_stops_cleanly_without_the_pre_stop_delay() -> None:
    # No load balancer sits in front of the launcher's children: waiting out the delay would
    # outlast stop()'s grace and end every gateway a benchmark ran by SIGKILL.
    async with running_sims(1) as [replica]:
        gateway = await start_gateway(pool_policy([replica.url]))
        assert await gateway.stop() == 0


async def test_a_sighup_while_it_starts_is_not_the_end_of_it(tmp_path: Path) -> None:
    # SIGHUP asks for a reload (a deploy script may send it right after starting the gateway);
    # the loop's handler comes once the gateway listens, and the default before that ends it.
    env = {"GATEWAY_HEALTH_TIMEOUT_S": "3", "GATEWAY_SHUTDOWN_DELAY_S": "0"}
    async with starting_against_a_silent_replica(tmp_path, env) as (gateway, starting):
        os.kill(gateway.pid, signal.SIGHUP)
        await starting  # raises if it exited before answering
        assert await gateway.stop() == 0


BODY = orjson.dumps(chat("s", "q", max_tokens=2))
FRAMINGS = {
    # Content-Length: the front frames it; chunked: aiohttp does.
    "front": (b"Content-Length: %d\r\n\r\n" % len(BODY), BODY[:20], BODY[20:]),
    "aiohttp": (
        b"Transfer-Encoding: chunked\r\n\r\n",
        b"14\r\n" + BODY[:20] + b"\r\n",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY) - 20, BODY[20:]),
    ),
}


async def upload_across_sigterm(
    gw: ManagedProcess, framing: str, rest_after_s: float | None
) -> tuple[int, bytes]:
    """A request whose head and first bytes of body arrive before SIGTERM, the rest of the body
    ``rest_after_s`` after it (never if None): the status and body of its answer."""
    head, first, rest = FRAMINGS[framing]
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + head + first)
    await writer.drain()
    await asyncio.sleep(0.2)
    os.kill(gw.pid, signal.SIGTERM)
    if rest_after_s is not None:
        await asyncio.sleep(rest_after_s)
        writer.write(rest)
    async with asyncio.timeout(5):
        status, _, body = await read_answer(reader)
    writer.close()
    return status, body


@pytest.mark.parametrize("framing", list(FRAMINGS))
async def test_a_request_whose_body_is_still_arriving_when_the_drain_begins_is_served(
    framing: str,
) -> None:
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "0.2", "GATEWAY_DRAIN_TIMEOUT_S": "5"}
    async with (
        running_sims(1, prefill_s_per_token=0, decode_step_s=0) as [replica],
        running_gateway([replica.url], env=env) as gw,
    ):
        # The rest comes after the shutdown delay: the listener has closed, the drain runs.
        status, body = await upload_across_sigterm(gw, framing, rest_after_s=0.5)
    assert status == 200, body
    assert orjson.loads(body)["object"] == "chat.completion"


async def test_a_body_still_missing_at_the_drain_deadline_gets_503_shutting_down() -> None:
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "0", "GATEWAY_DRAIN_TIMEOUT_S": "0.5"}
    async with (
        running_sims(1) as [replica],
        running_gateway([replica.url], env=env) as gw,  # the body timeout is 30 s
    ):
        status, body = await upload_across_sigterm(gw, "front", rest_after_s=None)
    assert status == 503
    assert openai_error(body)["code"] == "shutting_down"
