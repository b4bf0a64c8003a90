"""Command line of the simulated replica: one flag per SimConfig field, served on uvloop."""

import argparse
import asyncio
import logging
import signal

import uvloop
from aiohttp import web
from prometheus_client import disable_created_metrics

from replica.sim.config import SimConfig, config_from_args
from replica.sim.server import make_runner

logger = logging.getLogger(__name__)


async def serve(config: SimConfig) -> None:
    """Serve until SIGTERM or SIGINT, then shut down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = make_runner(config)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        logger.info("sim replica %s on http://%s:%d", config.model, config.host, config.port)
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    """Entry point for ``llm-gateway sim-replica``; returns the process exit status."""
    config = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # vLLM exposes no *_created series; neither should its stand-in.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    uvloop.run(serve(config))
    return 0
