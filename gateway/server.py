"""Running the gateway process: uvloop, the aiohttp runner, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop
from aiohttp import web

from gateway.app import POLICY, build_app
from gateway.settings import Settings
from router_policies.schema import Policy

log = logging.getLogger(__name__)


async def serve(settings: Settings, policy: Policy) -> None:
    app = build_app(settings, policy)
    # handler_cancellation: a client that goes away cancels its handler, which closes the
    # upstream connection, which makes vLLM abort the request and free its KV cache.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    await site.start()
    log.info("llm-gateway listening on http://%s:%d", settings.host, settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app[POLICY].reload)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(settings: Settings, policy: Policy) -> None:
    uvloop.run(serve(settings, policy))
