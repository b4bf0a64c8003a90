"""`serve --workers N`: the parent process, which forks the workers, forwards signals to them
and replaces one that ends while the gateway is not stopping (crashed, hung, or stopped by
someone else's signal), in the same place of the worker mesh.

A replacement starts with the policy file as the workers last reloaded it (the parent reads it
again as it changes, with the rules a reload applies), not the one the parent read at
start-up: a tenant's revoked key must not come back with it. One that cannot start (a tier
model file gone) is tried again, while its siblings serve. Each worker runs in a process group
of its own, so a terminal's Ctrl-C reaches the parent alone, which forwards it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from gateway.policy.reload import PolicyHolder, ReloadResult, Stamp
from gateway.settings import Settings
from gateway.shared_state.worker_mesh import MeshPlace
from gateway.state_backend import policy_refusal
from gateway.watchdog import CRASHED, HUNG, Heartbeats
from router_policies.schema import Policy

log = logging.getLogger(__name__)

STARTUP_FAILED = 2
"""A worker's exit status when it could not start (the port taken): every worker would fail
alike."""
_RESPAWN_PAUSE_S = 1.0
_WATCH_S = 0.2
"""How often the parent looks for ended and silent workers, and for a stop signal while it
waits to start a replacement."""
_PR_SET_PDEATHSIG = 1

RunOne = Callable[[Settings, Policy, Stamp | None, MeshPlace, tuple[Heartbeats, int]], int]
"""Runs one worker to its end (gateway/server.py), with the policy as read from the file at
that stamp; its exit status."""

_parent: int | None = None
"""In a worker, the parent that forked it; None in the parent, and under a single process."""


async def reload_every_worker(policy: PolicyHolder) -> ReloadResult:
    """The admin API's reload: this process's, whose result it answers, then, in a worker,
    every worker's: the file watch sees only the policy file, so a file it names (a tier
    model) replaced under an unchanged policy would stay old in the workers the call did not
    reach. The parent forwards a SIGHUP to each (this one reloads again, alike: reloads are
    idempotent), and reads the file again for the workers it starts later. A reload refused
    here is refused there too: the others keep their policy, unbothered."""
    result = await policy.reload()
    if result.ok and _parent is not None and os.getppid() == _parent:  # not a parent gone
        os.kill(_parent, signal.SIGHUP)
    return result


def run_workers(
    settings: Settings, policy: Policy, run_one: RunOne, read_at: Stamp | None = None
) -> int:
    """Fork the workers, forward SIGTERM/SIGINT/SIGHUP to them, replace any that ends before
    a stop (gateway/watchdog.py for the hung ones). ``read_at``: the policy file's stamp when
    ``policy`` was read from it."""
    if settings.port == 0:
        log.error("--workers > 1 needs a fixed --port: each worker binds it with SO_REUSEPORT")
        return 2
    # The workers' sockets (their /metrics for each other; without Redis, the routing state
    # they share) in a directory only this user can enter.
    run_dir = Path(tempfile.mkdtemp(prefix="llm-gateway-workers-"))
    try:
        supervisor = _Supervisor(settings, policy, run_dir, run_one)
        if read_at is not None:
            supervisor.policy.read_when(read_at)
        return supervisor.run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _fork(
    settings: Settings, policy: PolicyHolder, place: MeshPlace, beat: tuple[Heartbeats, int],
    run: RunOne,
) -> int:  # fmt: skip
    """The new worker's pid. The signals the parent forwards are blocked until the parent has
    it in its list and the child has its own handlers: one in between would miss the new
    worker, or run the parent's handler in the child."""
    beat[0].starting(beat[1])
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    global _parent
    _parent = parent
    code = 1
    try:
        os.setpgid(0, 0)  # a signal to the parent's group is the parent's to forward
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload, once its loop takes it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        if sys.platform == "linux":
            # A worker whose parent is killed outright stops too, rather than serve alone.
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        code = run(settings, policy.fleet.policy, policy.read_at, place, beat)
    finally:
        if os.getppid() != parent:
            _leave_run_dir(place)
        logging.shutdown()
        os._exit(code)


def _leave_run_dir(place: MeshPlace) -> None:
    """A worker whose parent is gone (killed outright: its cleanup never ran) removes its own
    sockets, and the run's directory once the last worker has: nobody else will. Only then: a
    living parent removes the directory itself, and may start a replacement on these paths."""
    # Never raises: the caller's os._exit must follow, or the child would run the parent's code.
    with contextlib.suppress(OSError):
        for path in (place.socket_path(place.index), place.metrics_socket_path(place.index)):
            path.unlink(missing_ok=True)
        place.directory.rmdir()  # fails while another worker's sockets are there: its to remove


class _Supervisor:
    def __init__(self, settings: Settings, policy: Policy, run_dir: Path, run: RunOne) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.run_one = run
        self.workers: dict[int, int] = {}
        """Each worker's index (its place in the mesh, kept by its replacement), by pid."""
        self.killed: set[int] = set()
        """Workers killed for hanging, not yet reaped."""
        self.heartbeats = Heartbeats(settings.workers)
        self.stopping = False
        self.reread = False
        """Read the policy file again before the next replacement (a SIGHUP came)."""
        self.next_look = 0.0
        """When to look at the policy file next: as often as the workers' watch looks."""
        self.replacements: set[int] = set()
        path = Path(settings.policy) if settings.policy is not None else None
        self.policy = PolicyHolder(policy, path, lambda ok: None, refuse=policy_refusal(settings))
        """The policy a worker starts with: the file as it was when the last one started."""

    def start(self, index: int) -> int:
        place = MeshPlace(self.run_dir, self.settings.workers, index)
        beat = (self.heartbeats, index)
        try:
            pid = _fork(self.settings, self.policy, place, beat, self.run_one)
            self.workers[pid] = index
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        return pid

    def kill_hung(self) -> None:
        for pid, index in self.workers.items():
            silent = self.heartbeats.silent_s(index)
            if pid in self.killed or silent <= self.settings.worker_stuck_s:
                continue
            log.error(
                "worker %d sent no heartbeat for %.1f s (stopped or wedged); killing it",
                pid, silent,
            )  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.killed.add(pid)

    def forward(self, sig: int, _frame: FrameType | None) -> None:
        if sig == signal.SIGHUP:
            self.reread = True  # its file, for the next replacement: read outside the handler
        else:
            self.stopping = True
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def run(self) -> int:
        for sig in _FORWARDED:
            signal.signal(sig, self.forward)
        for index in range(self.settings.workers):
            self.start(index)
        log.info("llm-gateway: %d workers on port %d", self.settings.workers, self.settings.port)
        worst = 0
        while self.workers:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                self.kill_hung()  # stopping too: a stopped worker would hold the exit forever
                self.keep_policy()
                time.sleep(_WATCH_S)
                continue
            if pid not in self.workers:
                continue  # not a worker of ours
            index = self.workers.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            replacement = pid in self.replacements
            self.replacements.discard(pid)
            if code == STARTUP_FAILED and not replacement:
                self.forward(signal.SIGTERM, None)  # every worker would fail alike
            if self.stopping or (code == STARTUP_FAILED and not replacement):
                # A worker stopped before its own handler was set ends by the SIGTERM itself.
                worst = max(worst, 0 if code == -signal.SIGTERM else abs(code))
                continue
            self.replace(pid, index, code)
        return worst

    def keep_policy(self) -> None:
        """The file's policy, as the workers reload it, for the next replacement: kept as it
        changes, once it has stood still for one look (a file written in place in parts is
        read whole, as the workers' watch reads it), so an invalid edit leaves the last good
        one, as it does in the workers. A replacement is told when its policy was read: a file
        changed since (being written, or one that did not load) it reads for itself."""
        now = time.monotonic()
        if not self.reread and now < self.next_look:
            return
        self.next_look = now + self.settings.policy_watch_interval_s
        if self.reread or self.policy.settled_change():
            self.reread = False
            asyncio.run(self.policy.reload())

    def replace(self, pid: int, index: int, code: int) -> None:
        hung = pid in self.killed
        self.killed.discard(pid)
        self.heartbeats.replaced(HUNG if hung else CRASHED)
        if not hung:
            log.error("worker %d ended with %d; starting another", pid, code)
        deadline = time.monotonic() + _RESPAWN_PAUSE_S
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(_WATCH_S)  # a stop signal now ends the wait: nothing to start then
            self.keep_policy()
        if self.stopping:  # checked again: a stop may come while the file is read
            return
        self.replacements.add(self.start(index))
