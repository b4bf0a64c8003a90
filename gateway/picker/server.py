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

_MESSAGE_SLACK = 64 * 1024
"""What a body's message holds besides the body (its framing, a few bytes) and more: the
other messages (headers, trailers) are far smaller."""


def add_picker(app: web.Application, host: str, port: int) -> None:
    """Serve the picker on ``host:port`` while ``app`` runs (after its background tasks
    start, before they stop)."""
    app.cleanup_ctx.append(functools.partial(_picker, host=host, port=port))


async def _picker(app: web.Application, *, host: str, port: int) -> AsyncIterator[None]:
    # No SO_REUSEPORT: a second picker on a taken port must fail, not share it unseen. A body
    # Envoy buffers (up to the body limit, its buffer's) comes whole in one message: past
    # gRPC's 4 MiB default the stream would fail and Envoy, failing open, skip the picker.
    options = [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", app[SETTINGS].max_body_bytes + _MESSAGE_SLACK),
    ]
    server = grpc.aio.server(options=options)
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
