"""Shared fixtures: replicas and gateways in-process (aiohttp test servers on the test's own
event loop) for behaviour the HTTP surface decides, real subprocesses where the process itself
matters (signals, the CLI, start-up), and real clients against both."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench.launcher import start_gateway
from gateway.http.app import build_app
from gateway.http.connections import ConnectionGate
from gateway.policy.check import load_checked_policy
from gateway.policy.reload import PolicyHolder
from gateway.server import client_side
from gateway.settings import Settings
from replica.processes import ManagedProcess, start_sim_replicas
from replica.sim.config import SimConfig
from replica.sim.server import build_app as build_sim_app
from router_policies.schema import parse_policy

pytest_plugins = ("tests.deploy", "tests.sim", "tests.real_vllm")
"""Fixture modules: the chart fixtures and the real-vLLM fleet (one instance a session each)
and the in-process sim."""

MODEL = "sim-model"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

FAST_PROBES = {
    "GATEWAY_HEALTH_INTERVAL_S": "0.2",
    "GATEWAY_SCRAPE_INTERVAL_S": "0.2",
    "GATEWAY_UNHEALTHY_AFTER": "1",
    "GATEWAY_HEALTHY_AFTER": "1",
}
FAST_PROBE_SETTINGS = {k.removeprefix("GATEWAY_").lower(): v for k, v in FAST_PROBES.items()}

GatewayClient = TestClient[web.Request, web.Application]


def policy_holder(path: Path, **options: Any) -> PolicyHolder:
    """The policy file at ``path`` held live, as a gateway holds it, reloads counted nowhere."""
    return PolicyHolder(load_checked_policy(path), path, lambda ok: None, **options)


def pool_policy(urls: Sequence[str], policy: str = "prefix-aware", **extra: Any) -> dict[str, Any]:
    return {"pools": {"small": {"model": MODEL, "replicas": list(urls), "policy": policy, **extra}}}


@contextlib.asynccontextmanager
async def running_sims(
    n: int, model: str = MODEL, **config_overrides: object
) -> AsyncIterator[list[ManagedProcess]]:
    """Simulated replicas as real subprocesses, stopped by PID however the test ends."""
    fleet = await start_sim_replicas(n, model, **config_overrides)
    try:
        yield fleet
    finally:
        for replica in fleet:
            await replica.stop()


@contextlib.asynccontextmanager
async def running_gateway(
    urls: Sequence[str],
    policy: str = "prefix-aware",
    env: dict[str, str] | None = None,
    **extra: Any,
) -> AsyncIterator[ManagedProcess]:
    gateway = await start_gateway(
        pool_policy(urls, policy, **extra), env={**FAST_PROBES, **(env or {})}
    )
    try:
        yield gateway
    finally:
        await gateway.stop()


@contextlib.asynccontextmanager
async def in_process_sims(
    n: int, model: str = MODEL, **config_overrides: Any
) -> AsyncIterator[list[str]]:
    """Simulated replicas on the test's event loop, as the real ones serve (a client that goes
    away cancels its handler); yields their base URLs."""
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for _ in range(n):
            app = build_sim_app(SimConfig(model=model, **config_overrides))
            server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
            await stack.enter_async_context(server)
            urls.append(str(server.make_url("")).rstrip("/"))
        yield urls


@contextlib.asynccontextmanager
async def in_process_gateway(
    policy: Mapping[str, Any],
    extend: Callable[[web.Application], None] | None = None,
    **settings: Any,
) -> AsyncIterator[GatewayClient]:
    """``build_app`` with ``policy`` (the policy file's content as data) behind a test client.

    The first health round runs before the client is handed out, as before a real gateway
    serves. ``settings`` override the fast probes and any other Settings field; ``extend``
    adds to the app before it starts, as `serve` lets `epp` add the picker.
    """
    app = build_app(Settings(**{**FAST_PROBE_SETTINGS, **settings}), parse_policy(dict(policy)))
    if extend is not None:
        extend(app)
    server = _GatewayTestServer(app, host="127.0.0.1", handler_cancellation=True)
    async with TestClient(server) as client:
        yield client


class _ServedLikeServe(web.AppRunner):
    """aiohttp's test runner, its connections served as ``serve`` serves them: by the front,
    which hands aiohttp the requests it does not take (gateway/http/front.py)."""

    _gate: ConnectionGate | None = None

    @property
    def server(self) -> web.Server | None:
        return cast(web.Server, self._gate)  # the listening socket's protocol factory

    async def setup(self) -> None:
        await super().setup()
        assert self._server is not None
        self._gate, _ = client_side(self.app, self._server, access_log=None)


class _GatewayTestServer(TestServer):
    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return _ServedLikeServe(self.app, **kwargs)


async def _alive(_: web.Request) -> web.Response:
    return web.Response()


@contextlib.asynccontextmanager
async def fake_replica(
    chat_handler: Handler, path: str = "/v1/chat/completions"
) -> AsyncIterator[str]:
    """A tiny misbehaving upstream with a passing health check, on the test's own event loop:
    ``chat_handler`` answers POSTs to ``path``."""
    app = web.Application()

    async def chat(request: web.Request) -> web.StreamResponse:
        # A coroutine function, which aiohttp asks of a handler (a callable object is deprecated).
        return await chat_handler(request)

    app.router.add_post(path, chat)
    app.router.add_get("/health", _alive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def breaks_mid_stream(request: web.Request) -> web.StreamResponse:
    """A fake replica's chat handler that sends one chunk ("partial ") and the first half of
    the next, and then dies: the failure after the first byte, which no retry can hide."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "delta": {"content": "partial "}, "finish_reason": None}]}  # fmt: skip
    event = b"data: " + orjson.dumps(chunk) + b"\n\n"
    await response.write(event)
    await asyncio.sleep(0.05)
    await response.write(event[: len(event) // 2])
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()
    return response


def gzips_its_stream(more: asyncio.Event | None = None) -> Handler:
    """A replica's chat handler that gzips its stream though asked for plain bytes: "zipped "
    then "stream" then [DONE], each flushed on its own; ``more``: awaited after the first."""

    def event(content: str) -> bytes:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                 "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}  # fmt: skip
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        )
        await response.prepare(request)
        packer = zlib.compressobj(wbits=31)  # gzip
        for i, part in enumerate((event("zipped "), event("stream"), b"data: [DONE]\n\n")):
            if i == 1 and more is not None:
                await more.wait()
            await response.write(packer.compress(part) + packer.flush(zlib.Z_SYNC_FLUSH))
        await response.write(packer.flush())
        return response

    return handler


def official_client(url: str) -> AsyncOpenAI:
    """The official client against the server at ``url``; no retries of its own, so a test
    sees every answer."""
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


async def admin_route(
    url: str, token: str, body: Mapping[str, Any], endpoint: str = "/v1/chat/completions"
) -> dict[str, Any]:
    """The gateway's dry run of ``body`` sent to ``endpoint`` (POST /admin/route)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/admin/route", params={"endpoint": endpoint}, json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):  # fmt: skip
        assert response.status == 200, await response.text()
        result: dict[str, Any] = await response.json()
        return result


async def learned_chars_per_token(url: str, token: str) -> float:
    """The characters per token the gateway's pool has learned from the replicas' usage (its
    /admin/route dry run shows it)."""
    probe = {"model": MODEL, "messages": [{"role": "user", "content": "?"}]}
    learned: float = (await admin_route(url, token, probe))["chars_per_token"]
    return learned


async def get_text(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def chat(system: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 8,
        **extra,
    }


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], within_s: float = 10.0, every_s: float = 0.05
) -> bool:
    """Whether ``check`` (a coroutine function, or a plain condition) comes true within
    ``within_s`` (asked every ``every_s``, and once more at the end): for state that other
    processes or tasks change."""

    async def holds() -> bool:
        result = check()
        return await result if inspect.isawaitable(result) else result

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await holds():
            return True
        await asyncio.sleep(every_s)
    return await holds()


async def answered(url: str, code: str, requests: float = 1.0) -> bool:
    """Whether the server at ``url`` counts ``requests`` of the small pool answered ``code``
    (its gateway_requests_total): a check for eventually()."""
    return await metric_sum(url, "gateway_requests_total", pool="small", code=code) == requests


async def metric_sum(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``, in the exposition
    the server at ``url`` serves on /metrics (0 where there are none)."""
    _, text = await get_text(f"{url}/metrics")
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with ``labels`` in Prometheus exposition ``text``."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None
