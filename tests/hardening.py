"""Helpers of the hardening tests (issue 8): raw HTTP on a socket, the gateway's log, and fake
replicas that fail beside good ones, a long stream under way, a gateway starting against a
replica that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import yaml
from aiohttp import web

from bench.launcher import GatewayProcess, gateway_argv
from replica.processes import ManagedProcess, free_port
from tests.conftest import chat, fake_replica, pool_policy, running_gateway, running_sims


async def raw_http(url: str, data: bytes, timeout_s: float = 5.0) -> tuple[int, bytes, bytes]:
    """Sends `data` as is on a new connection; the status, the head and the body of the
    answer, read until the server closes (status 0 if it closed without answering)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(data)
        await writer.drain()
        raw = b""
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                raw += chunk
                if _complete(raw):
                    break
    except ConnectionResetError:
        raw = b""
    finally:
        writer.close()
    if not raw:
        return 0, b"", b""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def _complete(raw: bytes) -> bool:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def openai_error(body: bytes) -> dict[str, object]:
    """The error object of an OpenAI-shaped error body (fails the test otherwise)."""
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return dict(error)


async def wait_for_log(process: ManagedProcess, needle: str, timeout_s: float = 5.0) -> str:
    """The process's whole log once it holds `needle` (or once `timeout_s` has passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = process.log_tail(1 << 22)
        if needle in text or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.05)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One answer with a Content-Length from a keep-alive connection: status, headers (names
    lower case), body; the connection stays open for the next."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    fields = {name.lower(): value for name, value in fields.items()}
    body = await reader.readexactly(int(fields["content-length"]))
    return int(lines[0].split(" ", 2)[1]), fields, body


class Counted:
    """A fake replica's handler, counting the requests it got."""

    def __init__(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        self.handler = handler
        self.hits = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        return await self.handler(request)


FAST: dict[str, Any] = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}


@contextlib.asynccontextmanager
async def beside_two_good(
    bad: Counted, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[ManagedProcess, str]]:
    """A round-robin gateway over a fake replica answering with ``bad`` and two good sims:
    (the gateway, the fake's replica name)."""
    async with (
        running_sims(2, **FAST) as good,
        fake_replica(bad) as bad_url,
        running_gateway([bad_url, *(g.url for g in good)], "round-robin", env=env) as gateway,
    ):
        yield gateway, bad_url.removeprefix("http://")


@contextlib.asynccontextmanager
async def long_stream_under_way(
    env: dict[str, str],
) -> AsyncIterator[tuple[ManagedProcess, aiohttp.ClientSession, aiohttp.ClientResponse]]:
    """A gateway (``env``) over one slow sim, and a stream through it that has begun: 400
    tokens, ~20 s, so it is in flight through whatever the test does next. Yields the
    gateway, the client's session and that stream's response."""
    body = orjson.dumps(chat("s", "a long story", max_tokens=400, stream=True))
    async with (
        running_sims(1, decode_step_s=0.05) as [replica],
        running_gateway([replica.url], env=env) as gw,
        aiohttp.ClientSession() as session,
    ):
        response = await session.post(f"{gw.url}/v1/chat/completions", data=body)
        assert response.status == 200
        await response.content.readany()
        yield gw, session, response


@contextlib.asynccontextmanager
async def starting_against_a_silent_replica(
    tmp_path: Path, env: dict[str, str]
) -> AsyncIterator[tuple[GatewayProcess, asyncio.Task[None]]]:
    """A gateway in its first health round, before it listens: its one replica accepts the
    probe and never answers (a vLLM still loading). Yields the gateway and the task of its
    start, which raises ProcessStartError if it exits before answering; stops both after."""
    probed = asyncio.Event()

    async def silent_replica(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        probed.set()

    replica = await asyncio.start_server(silent_replica, "127.0.0.1", 0)
    replica_url = f"http://127.0.0.1:{replica.sockets[0].getsockname()[1]}"
    port = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(pool_policy([replica_url])))
    gateway = GatewayProcess(
        gateway_argv(policy, port), f"http://127.0.0.1:{port}", policy, env=env
    )
    starting = asyncio.create_task(gateway.start(health_path="/health", timeout_s=30))
    try:
        async with asyncio.timeout(20):
            await probed.wait()
        yield gateway, starting
    finally:
        await gateway.stop()
        replica.close()
