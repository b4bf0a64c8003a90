"""The suite's real redis-server: it answers, dies when killed, comes back empty on the same
port, and is gone once the test ends."""

import os

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.redis_server import redis_server_binary
from tests.redis_server import running_redis


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still has a PID; only a reaped child is gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_binary_is_found_where_the_test_extra_is_installed() -> None:
    binary = redis_server_binary()
    assert binary is not None and os.access(binary, os.X_OK)


async def test_redis_answers_is_killed_restarts_empty_on_the_same_port_and_is_stopped() -> None:
    async with running_redis() as server:
        assert server.url == f"redis://127.0.0.1:{server.port}"
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        try:
            assert await client.ping()
            await client.set("k", "v")
            first_pid = server.pid

            await server.kill()
            assert not _alive(first_pid)
            with pytest.raises(RedisConnectionError):
                await client.get("k")

            await server.restart()
            assert server.pid != first_pid
            assert await client.get("k") is None  # --save '': nothing survives a restart
        finally:
            await client.aclose()
        last_pid = server.pid
    assert not _alive(last_pid)
