"""`llm-gateway epp`: the gateway's app (fleet state, probes, shared state, reload, /metrics,
the admin API, on the HTTP port) with the ext_proc gRPC server beside it in the same loop."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from gateway.app_keys import METRICS, OUTLIERS, SETTINGS
from gateway.picker.picker import Picker
from gateway.picker.service import ExternalProcessor
from gateway.server import StartupError

log = logging.getLogger(__name__)


def add_picker(app: web.Application, host: str, port: int) -> None:
    """Serve the picker on ``host:port`` while ``app`` runs (after its background tasks
    start, before they stop)."""
    app.cleanup_ctx.append(functools.partial(_picker, host=host, port=port))


async def _picker(app: web.Application, *, host: str, port: int) -> AsyncIterator[None]:
    # No SO_REUSEPORT: a second picker on a taken port must fail, not share it unseen.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    picker = Picker(app[METRICS], app[OUTLIERS], stream_usage=app[SETTINGS].stream_usage)
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(app, picker), server)
    target = _address(host, port)
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on {target} (gRPC): {exc}") from None
    if not bound:  # older gRPC said so by returning port 0
        raise StartupError(f"cannot listen on {target} (gRPC)")
    await server.start()
    # The port bound, not the one asked for: with --port 0 the system picked it.
    log.info("endpoint picker (Envoy ext_proc) listening on %s", _address(host, bound))
    try:
        yield
    finally:
        # Streams still open are requests Envoy is relaying: their ends feed the counts.
        await server.stop(app[SETTINGS].drain_timeout_s)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
