"""Issue 8, stopping: SIGTERM turns /ready 503 at once, keeps serving for the pre-stop delay,
drains up to a deadline, and ends what is left with an error the client can read."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import orjson

from bench.launcher import start_gateway
from tests.conftest import chat, pool_policy, running_gateway, running_sims


async def test_sigterm_readiness_first_then_a_bounded_drain() -> None:
    env = {"GATEWAY_SHUTDOWN_DELAY_S": "1.5", "GATEWAY_DRAIN_TIMEOUT_S": "1.5"}
    async with (
        running_sims(1, decode_step_s=0.05) as [replica],
        running_gateway([replica.url], env=env) as gw,
        aiohttp.ClientSession() as session,
    ):
        long_stream = orjson.dumps(chat("s", "a long story", max_tokens=400, stream=True))
        response = await session.post(f"{gw.url}/v1/chat/completions", data=long_stream)
        assert response.status == 200
        await response.content.readany()  # the stream has started: 400 tokens take ~20 s

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


async def test_a_gateway_the_launcher_started_stops_cleanly_without_the_pre_stop_delay() -> None:
    # No load balancer sits in front of the launcher's children: waiting out the delay would
    # outlast stop()'s grace and end every gateway a benchmark ran by SIGKILL.
    async with running_sims(1) as [replica]:
        gateway = await start_gateway(pool_policy([replica.url]))
        assert await gateway.stop() == 0
