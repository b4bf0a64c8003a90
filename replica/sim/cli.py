"""Command line of the simulated replica: one flag per SimConfig field, served on uvloop.

A value the config refuses, or a port that cannot be had, is one `error: --flag: ...` line on
stderr and exit status 2, as the gateway's own commands report theirs."""

import argparse
import asyncio
import errno
import logging
import signal
import sys

import uvloop
import zmq
from aiohttp import web
from prometheus_client import disable_created_metrics
from pydantic import ValidationError

from replica.sim.config import SimConfig, config_from_args
from replica.sim.server import make_runner

logger = logging.getLogger(__name__)

USAGE_ERROR = 2


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
        # The port bound, not the one asked for: with --port 0 the system picked it.
        port = runner.addresses[0][1] if runner.addresses else config.port
        logger.info("sim replica %s on http://%s:%d", config.model, config.host, port)
        await stop.wait()
    finally:
        await runner.cleanup()


def describe(exc: ValidationError) -> list[str]:
    """One `error:` line per mistake, naming the flag of the field it is in."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        message = error["msg"].removeprefix("Value error, ")
        if field:
            lines.append(f"error: --{field.replace('_', '-')}: {message} (got {error['input']!r})")
        else:
            lines.append(f"error: {message}")
    return lines


def _cannot_listen(config: SimConfig, exc: OSError) -> str:
    where = f"{config.host}:{config.port}"
    if exc.errno == errno.EADDRINUSE:
        # "address already in use": what replica/processes.py looks for to pick another port.
        return f"error: --port: cannot listen on {where}: address already in use"
    return f"error: cannot listen on {where}: {exc.strerror or exc}"


def run(args: argparse.Namespace) -> int:
    """Entry point for ``llm-gateway sim-replica``; returns the process exit status."""
    try:
        config = config_from_args(args)
    except ValidationError as exc:
        for line in describe(exc):
            print(line, file=sys.stderr)
        return USAGE_ERROR
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # vLLM exposes no *_created series; neither should its stand-in.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    try:
        uvloop.run(serve(config))
    except OSError as exc:  # the port is taken, the host does not resolve or is not ours
        print(_cannot_listen(config, exc), file=sys.stderr)
        return USAGE_ERROR
    except zmq.ZMQError as exc:  # an endpoint of --kv-events-config is taken
        print(f"error: --kv-events-config: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return 0
