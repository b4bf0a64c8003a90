"""Running the gateway process: uvloop, the listening socket, and an orderly stop on SIGTERM.

Stopping, as a pod behind a load balancer needs it: on SIGTERM /ready turns 503 at once while
requests are still accepted for `shutdown_delay_s` (the load balancer needs that long to stop
sending); then the socket closes and requests in flight get `drain_timeout_s` to finish; any
left then end with an error the client can read (a 503, or an SSE error event on a started
stream). A second SIGTERM or SIGINT skips what is left of the wait; one while the gateway starts
ends it, status 0, before it listens. What follows (closing connections, stopping the probes
and the Redis sharing, the event loop's teardown) is bounded too: a step still hanging
``_EXIT_BOUND_S`` later is logged once and the process exits anyway.

With ``workers`` > 1 the process forks that many workers before any event loop starts; each
listens on the same port with SO_REUSEPORT (the kernel spreads connections over them) and
shares routing state: through the Redis backend like separate instances do when one is
configured, else with the other workers over Unix sockets in a private directory the parent
makes (gateway/shared_state/worker_mesh.py). Whichever worker a scrape reaches answers /metrics
for all of them (gateway/telemetry/pod_metrics.py). The parent only forwards signals and
replaces a worker that crashes or hangs (gateway/watchdog.py), in the same place of the mesh.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvloop
from aiohttp import web

from gateway.app_keys import FORWARDER, LIFECYCLE, METRICS, POD_METRICS, POLICY, SETTINGS
from gateway.http.app import build_app
from gateway.http.completions import count_error, serve_framed
from gateway.http.connections import ConnectionGate, connection_limit
from gateway.http.front import Front
from gateway.policy.reload import Stamp
from gateway.settings import Settings
from gateway.shared_state.worker_mesh import MeshPlace
from gateway.supervisor import STARTUP_FAILED, run_workers
from gateway.telemetry.pod_metrics import PodMetrics
from gateway.watchdog import Heartbeats, ReplacedCollector, keep_beating
from router_policies.schema import InvalidPolicy, Policy

log = logging.getLogger(__name__)

_CANCEL_GRACE_S = 2.0
"""How long requests cancelled at the drain deadline get to write their error answer."""
_EXIT_BOUND_S = 3.0
"""From the end of the drain (and cancel grace) to the exit. With the cancel grace this stays
within the 5 s the Helm chart leaves after shutdown delay + drain timeout."""
_STUCK_EXIT = 1


class _ExitDeadline:
    """Ends the process if it has not exited ``bound_s`` after ``start``: a thread's timer,
    since a stuck event loop (or its teardown cancelling tasks) cannot time itself out."""

    def __init__(self, bound_s: float) -> None:
        self._bound_s = bound_s
        self._timer = threading.Timer(bound_s, self._give_up)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _give_up(self) -> None:
        log.error("stopping: cleanup still not done after %g s; exiting anyway", self._bound_s)
        os._exit(_STUCK_EXIT)  # the log handlers flush each record


class StartupError(Exception):
    """The gateway cannot start; the message is the one line an operator needs."""


async def serve(
    settings: Settings,
    policy: Policy,
    exit_deadline: _ExitDeadline,
    *,
    reuse_port: bool = False,
    mesh: MeshPlace | None = None,
    heartbeat: tuple[Heartbeats, int] | None = None,
    extend: Callable[[web.Application], None] | None = None,
    read_at: Stamp | None = None,
) -> None:
    """Serves until SIGTERM or SIGINT, then drains; ``extend`` adds to the app before it
    starts (the picker's gRPC server); ``read_at``: the policy file's stamp when ``policy``
    was read from it, where that was not just now (a replacement worker's)."""
    loop = asyncio.get_running_loop()
    # From the start: the first health round before listening lasts up to the probe timeout,
    # and a stop signal meanwhile would otherwise end the process unlogged (SIGTERM's default)
    # or with a KeyboardInterrupt traceback (SIGINT's).
    signalled = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    beating = None
    if heartbeat is not None:
        beating = asyncio.create_task(keep_beating(*heartbeat), name="worker heartbeat")
    app = build_app(settings, policy, mesh)
    if read_at is not None:
        app[POLICY].read_when(read_at)
    if extend is not None:
        extend(app)
    if heartbeat is not None:
        app[METRICS].registry.register(ReplacedCollector(heartbeat[0]))
    pod_metrics = None
    if mesh is not None:
        pod_metrics = app[POD_METRICS] = PodMetrics(mesh, app[METRICS].registry)
    handler_args: dict[str, Any] = {
        # A connection that has not sent complete headers within the timeout (counted from
        # its opening or its previous response) is closed: aiohttp's keep-alive timer, which
        # also runs before the first request, does exactly that.
        "keepalive_timeout": settings.header_timeout_s,
        "access_log": None,
    }
    # handler_cancellation: a client that goes away cancels its handler, which closes the
    # upstream connection, which makes vLLM abort the request and free its KV cache.
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=_CANCEL_GRACE_S, **handler_args
    )
    await runner.setup()
    if signalled.is_set():  # stopped while starting: nothing listens, nothing to drain
        log.info("stopping: signal received while starting; exiting without listening")
        exit_deadline.start()
        await runner.cleanup()
        if beating is not None:
            beating.cancel()
        return
    assert runner.server is not None
    gate, front = client_side(app, runner.server, **handler_args)
    if pod_metrics is not None:
        await pod_metrics.start()
    try:
        listener = await loop.create_server(
            gate, settings.host, settings.port, backlog=1024, reuse_address=True,
            reuse_port=reuse_port or None,
        )  # fmt: skip
    except OSError as exc:
        await runner.cleanup()
        if pod_metrics is not None:
            await pod_metrics.stop()
        raise StartupError(_cannot_listen(settings, exc)) from None
    log.info(
        "llm-gateway listening on http://%s:%d (at most %d client connections)",
        settings.host, listener.sockets[0].getsockname()[1], gate.limit,
    )  # fmt: skip
    loop.add_signal_handler(signal.SIGHUP, app[POLICY].reload_soon)
    try:
        await signalled.wait()
        await _drain(app, runner, front, listener, settings, signalled)
    finally:
        listener.close()
        exit_deadline.start()
        await runner.cleanup()
        if pod_metrics is not None:
            await pod_metrics.stop()
        if beating is not None:
            beating.cancel()


def _cannot_listen(settings: Settings, exc: OSError) -> str:
    return f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}"


def port_taken(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be had, if something listens on it already (or the host is not
    this machine's). The workers bind it with SO_REUSEPORT, which the kernel grants a second
    server of the same user as well: it would start and take a share of this port's
    connections. The CLI asks first, before any probe starts."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:  # socket.gaierror: a host that does not resolve
        return exc
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds
            try:
                probe.bind(address)
            except OSError as exc:
                return exc
    return None


async def _drain(
    app: web.Application,
    runner: web.AppRunner,
    front: Front,
    listener: asyncio.AbstractServer,
    settings: Settings,
    signalled: asyncio.Event,
) -> None:
    lifecycle = app[LIFECYCLE]
    lifecycle.draining = True
    log.info(
        "stopping: /ready answers 503; accepting requests %g s more, then draining up to %g s",
        settings.shutdown_delay_s, settings.drain_timeout_s,
    )  # fmt: skip
    signalled.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(signalled.wait(), settings.shutdown_delay_s)
    listener.close()
    assert runner.server is not None
    runner.server.pre_shutdown()  # keep-alive connections close after their current response
    uploads = front.pre_shutdown()  # requests whose body is still arriving: in flight too
    deadline = time.monotonic() + settings.drain_timeout_s
    second_signal = asyncio.ensure_future(signalled.wait())
    try:
        while (lifecycle.inflight or uploads) and not signalled.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            pending: set[asyncio.Future[Any]] = {*lifecycle.inflight, *uploads, second_signal}
            await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            uploads = [ended for ended in uploads if not ended.done()]
    finally:
        second_signal.cancel()
    front.refuse_uploads()
    left = [task for task in lifecycle.inflight if not task.done()]
    if not left:
        log.info("stopping: no request in flight")
        return
    # The wait ends early only for a second signal: its operator asked for this, where a
    # deadline reached may call for a longer drain timeout.
    ended_by = "second signal received" if signalled.is_set() else "drain deadline reached"
    log.warning("stopping: %s, ending %d requests in flight", ended_by, len(left))
    app[FORWARDER].closing = True
    for task in left:
        task.cancel()
    await asyncio.wait(left, timeout=_CANCEL_GRACE_S)


def client_side(
    app: web.Application, server: web.Server, **handler_args: Any
) -> tuple[ConnectionGate, Front]:
    """The listening socket's protocol factory (``ConnectionGate``), its connections served by
    the front and handed to aiohttp's ``server`` for what the front does not take."""
    settings = app[SETTINGS]
    limit = connection_limit(settings.max_connections)
    gate = ConnectionGate(server, limit, app[METRICS], **handler_args)
    front = Front(
        functools.partial(serve_framed, app),
        gate.handler,
        functools.partial(count_error, app),
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        send_timeout_s=settings.send_timeout_s,
        max_body_bytes=settings.max_body_bytes,
        on_open=gate.count,
    )
    gate.front = front.connection
    return gate, front


def run(
    settings: Settings,
    policy: Policy,
    extend: Callable[[web.Application], None] | None = None,
    read_at: Stamp | None = None,
) -> int:
    """Serves ``policy``, read from the file as it stood at ``read_at``."""
    if settings.workers > 1:
        # The CLI has checked the port is free (port_taken): workers binding it with
        # SO_REUSEPORT would otherwise share it with whatever listens there.
        return run_workers(settings, policy, _run_worker, read_at)
    return _run_one(settings, policy, extend=extend, read_at=read_at)


def _run_worker(
    settings: Settings,
    policy: Policy,
    read_at: Stamp | None,
    mesh: MeshPlace,
    heartbeat: tuple[Heartbeats, int],
) -> int:
    return _run_one(
        settings, policy, reuse_port=True, mesh=mesh, heartbeat=heartbeat, read_at=read_at
    )


def _run_one(
    settings: Settings,
    policy: Policy,
    *,
    reuse_port: bool = False,
    mesh: MeshPlace | None = None,
    heartbeat: tuple[Heartbeats, int] | None = None,
    extend: Callable[[web.Application], None] | None = None,
    read_at: Stamp | None = None,
) -> int:
    exit_deadline = _ExitDeadline(_EXIT_BOUND_S)
    try:
        main = serve(
            settings, policy, exit_deadline, reuse_port=reuse_port, mesh=mesh,
            heartbeat=heartbeat, extend=extend, read_at=read_at,
        )  # fmt: skip
        uvloop.run(main)
    except (StartupError, InvalidPolicy) as exc:
        # InvalidPolicy: what the check before could not see (a tier model file replaced since).
        log.error("%s", exc)
        return STARTUP_FAILED
    finally:
        exit_deadline.cancel()
    return 0
