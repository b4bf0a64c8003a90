"""Shared helpers of the simulated-replica tests: token runs, the zero-delay timing, the
`serve` fixture that starts simulated replicas in-process, with URLs and OpenAI clients for them,
and the `stream_options` a stream may be sent with, each with whether vLLM ends it with usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import openai
import pytest
from aiohttp.test_utils import TestServer

from replica.sim.config import SimConfig
from replica.sim.server import build_app

ZERO_DELAY = {"prefill_s_per_token": 0.0, "decode_step_s": 0.0, "decode_s_per_seq": 0.0}


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


Serve = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[TestServer] = []

    async def start(**overrides: object) -> TestServer:
        config = SimConfig.model_validate({**ZERO_DELAY, **overrides})
        server = TestServer(build_app(config), handler_cancellation=True)
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


def base_url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def client_for(server: TestServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(server) + "/v1", api_key="x", max_retries=0)


# vLLM 0.32's StreamOptions: `include_usage: bool | None = False` (a real replica ends a stream
# sent `stream_options: {}` with no usage event).
STREAM_OPTIONS_USAGE = [
    (None, False),
    ({}, False),
    ({"continuous_usage_stats": False}, False),
    ({"include_usage": True}, True),
    ({"include_usage": None}, False),
    ({"include_usage": False}, False),
]
