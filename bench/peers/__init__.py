"""The peer routers the comparison runs against, as child processes: vllm-router and sglang-router.

Both are Rust binaries from PyPI wheels, installed by ``bench/peers/install.sh`` into a virtualenv
of their own (``.cache/peers-venv``, or ``$PEERS_VENV``). Each starts with the flags checked in
TOOLS.md ("Peers to benchmark against") and nothing tuned: the policy under test, the worker
URLs, loopback, its own ``--prometheus-port`` (both default to 29000, so two routers, or a
router and anything else on that port, would collide) and a quiet log level. A router counts as
started once its ``/readiness`` says every worker is healthy, the equivalent of the gateway's
``/ready``: sglang-router answers ``/health`` before it has registered any worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import aiohttp
import orjson

from bench.launcher import READY_TIMEOUT_S
from replica.processes import (
    ManagedProcess,
    ProcessStartError,
    free_port,
    python_check,
    start_on_free_port,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV_ENV = "PEERS_VENV"
"""Overrides where the peers' virtualenv is (the same variable install.sh reads)."""
INSTALL_SCRIPT = HERE / "install.sh"
"""Installs the peers; it sits beside this module."""
VERSIONS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
"""The releases whose flags are used here (TOOLS.md)."""
PeerKind = Literal["vllm-router", "sglang-router"]
PEER_POLICIES: dict[str, tuple[str, ...]] = {
    "vllm-router": ("round_robin", "cache_aware", "power_of_two", "consistent_hash"),
    "sglang-router": ("round_robin", "cache_aware", "power_of_two"),
}
_HOST = "127.0.0.1"
_CHECK_TIMEOUT_S = 30.0


def default_venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".cache" / "peers-venv")


def peers_available(venv: Path | None = None) -> str | None:
    """None when both peer routers can start; otherwise why not, and the command that fixes it."""
    venv = venv or default_venv()
    python = venv / "bin" / "python"
    if not python.is_file():
        return f"no peers virtualenv at {venv}: run {INSTALL_SCRIPT.relative_to(ROOT)}"
    if not (venv / "bin" / "vllm-router").is_file():
        return f"no vllm-router in {venv}/bin: run {INSTALL_SCRIPT.relative_to(ROOT)}"
    check = (
        "import importlib.metadata as md, importlib.util, sys\n"
        "want = dict(a.split('==') for a in sys.argv[1:])\n"
        "for name, version in want.items():\n"
        "    have = md.version(name)\n"
        "    if have != version: sys.exit(f'{name} {have} is installed, not {version}')\n"
        "if importlib.util.find_spec('sglang_router.launch_router') is None:\n"
        "    sys.exit('sglang_router.launch_router is missing')\n"
    )
    pins = [f"{name}=={version}" for name, version in VERSIONS.items()]
    failure = python_check(python, check, *pins, timeout_s=_CHECK_TIMEOUT_S)
    if failure is not None:
        return f"peer routers not usable in {venv} ({failure}): re-run {INSTALL_SCRIPT.name}"
    return None


def install_peers(timeout_s: float = 600.0) -> str | None:
    """Run install.sh (idempotent); None on success, else its last words."""
    try:
        result = subprocess.run(
            [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{INSTALL_SCRIPT.name} did not run: {exc}"
    if result.returncode != 0:
        return (result.stderr.strip() or result.stdout.strip() or "failed").splitlines()[-1]
    return None


def peer_argv(
    kind: PeerKind,
    policy: str,
    worker_urls: Sequence[str],
    port: int,
    prometheus_port: int,
    venv: Path | None = None,
) -> list[str]:
    """One peer router's command line (TOOLS.md flags; metrics bound to loopback)."""
    if policy not in PEER_POLICIES[kind]:
        raise ValueError(f"{kind} has no policy {policy!r} (one of {PEER_POLICIES[kind]})")
    if not worker_urls:
        raise ValueError("a router needs at least one worker URL")
    bin_dir = (venv or default_venv()) / "bin"
    if kind == "vllm-router":
        head = [str(bin_dir / "vllm-router")]
        level = "warning"
    else:
        head = [str(bin_dir / "python"), "-m", "sglang_router.launch_router"]
        level = "warn"
    return [
        *head,
        "--host", _HOST,
        "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--prometheus-port", str(prometheus_port),
        "--prometheus-host", _HOST,
        "--log-level", level,
    ]  # fmt: skip


async def _all_workers_ready(url: str, workers: int, timeout_s: float) -> None:
    """Poll ``/readiness`` until it reports ``workers`` healthy workers."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with session.get(f"{url}/readiness") as response:
                    if response.status == 200:
                        body = orjson.loads(await response.read())
                        if int(body.get("healthy_workers", 0)) >= workers:
                            return
            if time.monotonic() > deadline:
                raise ProcessStartError(
                    f"{url} has not {workers} healthy workers after {timeout_s} s"
                )
            await asyncio.sleep(0.05)


async def start_peer(
    kind: PeerKind,
    policy: str,
    worker_urls: Sequence[str],
    *,
    venv: Path | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> ManagedProcess:
    """Start one peer router on loopback; return it once every worker is healthy in it.

    Ports are picked free (the router's and its metrics port), and picked again if another
    process takes one first. Stop the result with ``await process.stop()``.
    """

    def build(port: int) -> ManagedProcess:
        argv = peer_argv(kind, policy, worker_urls, port, free_port(_HOST), venv)
        return ManagedProcess(argv, f"http://{_HOST}:{port}", name=f"{kind}-{policy}")

    async def start(process: ManagedProcess) -> None:
        await process.start(health_path="/readiness", timeout_s=ready_timeout_s)
        await _all_workers_ready(process.url, len(worker_urls), ready_timeout_s)

    return await start_on_free_port(build, start, host=_HOST)
