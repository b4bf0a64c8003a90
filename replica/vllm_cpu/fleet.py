"""Real vLLM replicas on the CPU, as child processes: for the `vllm` tests and benchmarks.

Each replica runs the CPU development profile of replica/vllm_launch.py with its engine bound to
a core of its own (two replicas sharing cores slow each other to a crawl). Startup to /health
takes 20-45 s on a warm machine and about a minute on a cold one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from replica.processes import (
    ManagedProcess,
    kv_events_endpoint,
    python_check,
    start_all,
    start_on_free_port,
)
from replica.vllm_cpu.tiny_model import default_dir, has_model
from replica.vllm_launch import CPU_HOST, cpu_dev_profile, cpu_dtype, environment, render

ROOT = Path(__file__).resolve().parents[2]
VENV_ENV = "VLLM_CPU_VENV"
"""Overrides where the vllm-cpu virtualenv is (the same variable install.sh reads)."""
DEFAULT_SERVED_NAME = "tiny-llama"
STARTUP_TIMEOUT_S = 180.0
"""Startup is 20-45 s warm, ~60 s cold; two replicas starting at once share the machine."""
STOP_GRACE_S = 30.0
"""SIGTERM stops a replica in ~2 s; SIGKILL only after this, since it would orphan the engine."""
_IMPORT_TIMEOUT_S = 120.0


def default_venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".cache" / "vllm-cpu-venv")


def venv_python(venv: Path | None = None) -> Path:
    return (venv or default_venv()) / "bin" / "python"


def vllm_cpu_available(venv: Path | None = None, model_dir: Path | None = None) -> str | None:
    """None when real CPU replicas can start; otherwise the reason they cannot, and the fix.

    ``model_dir`` is checked too when given. The check imports vllm in the venv (a few seconds).
    """
    venv = venv or default_venv()
    python = venv_python(venv)
    if not python.is_file():
        return f"no vllm-cpu virtualenv at {venv}: run replica/vllm_cpu/install.sh"
    if model_dir is not None and not has_model(model_dir):
        return (
            f"no model in {model_dir}: run "
            f"{python} -m replica.vllm_cpu.tiny_model --out {model_dir}"
        )
    failure = python_check(python, "import vllm", timeout_s=_IMPORT_TIMEOUT_S)
    if failure is not None:
        return f"`import vllm` fails in {venv} ({failure}): re-run replica/vllm_cpu/install.sh"
    return None


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid``: tells a process apart from a later one with its PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 counted after the parenthesised command name, which may itself hold spaces.
    return stat.rpartition(")")[2].split()[19]


def _descendants(pid: int) -> list[tuple[int, str]]:
    """Every process below ``pid`` (Linux /proc), with its start time; [] where /proc is absent."""
    found: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for child in map(int, children.read_text().split()):
                    started = _start_time(child)
                    if started is not None:
                        found.append((child, started))
                        todo.append(child)
    return found


class VllmCpuReplica(ManagedProcess):
    """A vLLM API server whose engine-core and worker processes never outlive it.

    vLLM shuts its own children down on SIGTERM; after a SIGKILL they would be orphaned and keep
    their core busy, so whatever is left of them is killed too, each by its own PID.
    """

    children_grace_s = 5.0
    """After a clean stop, how long the children get to exit on their own before SIGKILL."""

    async def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        children = self._children()
        try:
            return await super().stop(grace_s)
        finally:
            await _reap(children, self.children_grace_s)

    async def kill(self) -> None:
        children = self._children()
        try:
            await super().kill()
        finally:
            await _reap(children, grace_s=0.0)

    def _children(self) -> list[tuple[int, str]]:
        return _descendants(self.pid) if self.is_running() else []


def _alive(children: list[tuple[int, str]]) -> list[int]:
    return [pid for pid, t in children if _start_time(pid) == t and not _zombie(pid)]


async def _wait_gone(children: list[tuple[int, str]], timeout_s: float) -> list[int]:
    """Polls until none of ``children`` is alive or ``timeout_s`` passed; returns those left."""
    interval_s = 0.05
    for _ in range(int(timeout_s / interval_s)):
        if not _alive(children):
            return []
        await asyncio.sleep(interval_s)
    return _alive(children)


async def _reap(children: list[tuple[int, str]], grace_s: float) -> None:
    """SIGKILL those of ``children`` alive after ``grace_s`` (the same process: same start time),
    and wait until they are gone."""
    for pid in await _wait_gone(children, grace_s):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await _wait_gone(children, 2.0)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def host_cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    return frozenset()


def replica_argv_env(
    port: int,
    core: int,
    model_dir: Path,
    served_model_name: str,
    venv: Path,
    dtype: str | None = None,
    kv_events: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """One CPU replica's command line and extra environment, from the launch recipe.

    With no ``dtype``, the one this host runs fastest (bf16 only where its matmul is native);
    ``kv_events``: it publishes KV-cache events at kv_events_endpoint(port).
    """
    profile = cpu_dev_profile(
        str(model_dir),
        served_model_name,
        port=port,
        core=core,
        python=str(venv_python(venv)),
        dtype=dtype or cpu_dtype(host_cpu_flags()),
        kv_events_endpoint=kv_events_endpoint(port) if kv_events else None,
    )
    return render(profile), environment(profile)


def _build(
    index: int,
    core: int,
    model_dir: Path,
    served_model_name: str,
    venv: Path,
    keep_log: bool,
    dtype: str | None,
    kv_events: bool,
) -> Callable[[int], VllmCpuReplica]:
    def build(port: int) -> VllmCpuReplica:
        argv, env = replica_argv_env(
            port, core, model_dir, served_model_name, venv, dtype, kv_events
        )
        return VllmCpuReplica(
            argv, f"http://{CPU_HOST}:{port}", env=env, name=f"vllm-cpu-{index}", keep_log=keep_log
        )

    return build


async def start_vllm_cpu_replicas(
    n: int = 2,
    model_dir: Path | None = None,
    served_model_name: str = DEFAULT_SERVED_NAME,
    venv: Path | None = None,
    *,
    cores: list[int] | None = None,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    keep_logs: bool = False,
    dtype: str | None = None,
    kv_events: bool = True,
) -> list[ManagedProcess]:
    """Start ``n`` real vLLM CPU replicas at once, replica i on core ``cores[i]`` (default i).

    Returns them once every one answers /health 200, or stops them all and raises
    ProcessStartError (with the failing replica's log tail). Each logs to a file of its own
    (``process.log_path``), removed after a clean stop unless ``keep_logs``. Stop each with
    ``await process.stop()``. ``dtype`` None picks the host's fastest (see replica_argv_env).
    ``kv_events``: each publishes KV-cache events (replica.processes.kv_event_endpoints).
    """
    model_dir = (model_dir or default_dir("tiny")).resolve()
    venv = venv or default_venv()
    cores = list(range(n)) if cores is None else cores
    if len(cores) != n or len(set(cores)) != n:
        raise ValueError(f"{n} replicas need {n} distinct cores, got {cores}")
    usable = os.sched_getaffinity(0)
    if not set(cores) <= usable:
        raise ValueError(f"cores {sorted(set(cores) - usable)} are not usable here ({usable})")

    async def start(process: ManagedProcess) -> None:
        await process.start(timeout_s=startup_timeout_s)

    return await start_all(
        start_on_free_port(
            _build(i, core, model_dir, served_model_name, venv, keep_logs, dtype, kv_events),
            start,
            host=CPU_HOST,
        )
        for i, core in enumerate(cores)
    )
