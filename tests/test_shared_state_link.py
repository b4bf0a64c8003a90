"""What the Redis backends report of Redis, on a real redis-server: one warning when it stops
serving them and one line when it serves them again, whatever the way it fails (a Redis that
answers reads but refuses writes is down too, and one that comes up after the gateway is
"reachable"), the warning saying what is wrong where a retry cannot fix it (a wrong password,
an untrusted certificate). Both fail open meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter

from gateway.rate_limit.redis_store import RedisStore
from gateway.shared_state.redis_state import RedisState
from router_policies.rate_limit import Limit
from tests.conftest import eventually
from tests.redis_server import running_redis
from tests.shared_state import fleet as routing_fleet
from tests.shared_state import redis_state, returns, started

_SHARED = "gateway.shared_state.redis_state"
_LIMITS = "gateway.rate_limit.redis_store"


def _up(state: RedisState) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return state.up

    return check


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


async def _replicate_without_files(replica: aioredis.Redis, primary_url: str) -> None:
    """Replication through the socket only: an RDB file would land in the test's directory."""
    primary = aioredis.from_url(primary_url)
    try:
        await primary.config_set("repl-diskless-sync", "yes")
        await primary.config_set("repl-diskless-sync-delay", "0")
    finally:
        await primary.aclose()
    await replica.config_set("repl-diskless-load", "swapdb")


@pytest.mark.parametrize("refusal", ["maxmemory", "replica"])
async def test_a_redis_that_answers_reads_but_refuses_writes_is_down_once_then_back_once(
    caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    async with running_redis() as server, running_redis() as primary:
        admin = aioredis.from_url(server.url)
        # Two instances: each reads the other's stream, so reads go on while writes fail.
        states = [redis_state(server.url, sync_interval_s=0.02) for _ in range(2)]
        try:
            with caplog.at_level(logging.INFO, logger=_SHARED):
                for state in states:
                    await started(state, routing_fleet())
                    assert await eventually(_up(state))
                await asyncio.sleep(0.3)  # each has seen the other: both read
                if refusal == "maxmemory":
                    await admin.config_set("maxmemory", "1")  # out of memory for every write
                else:  # a replica after a failover: reads served, writes READONLY
                    await _replicate_without_files(admin, primary.url)
                    await admin.replicaof("127.0.0.1", primary.port)
                seen = []
                for _ in range(100):  # 1 s: dozens of read rounds, and write retries
                    await asyncio.sleep(0.01)
                    seen.append([state.up for state in states])
                if refusal == "maxmemory":
                    await admin.config_set("maxmemory", "0")
                else:
                    await admin.replicaof("NO", "ONE")
                for state in states:
                    assert await eventually(_up(state))
        finally:
            for state in states:
                assert await returns(state.stop())
            await admin.aclose()
    down_from = next(i for i, ups in enumerate(seen) if not any(ups))
    assert not any(any(ups) for ups in seen[down_from:])  # no read round counted as up
    lines = _lines(caplog, _SHARED)
    down = [line for line in lines if "serving from local state" in line]
    assert len(down) == 2  # one per instance
    if refusal == "maxmemory":  # (a replica's first failure may be its flush ending a read)
        assert all("Redis refuses writes (OutOfMemoryError)" in line for line in down)
    assert sum("Redis is back" in line for line in lines) == 2


async def test_a_redis_that_starts_after_the_gateway_is_reported_reachable_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_redis() as server:
        await server.kill()  # its port, with nothing listening yet
        state = redis_state(server.url)
        with caplog.at_level(logging.INFO, logger=_SHARED):
            await started(state, routing_fleet())
            await asyncio.sleep(0.3)
            await server.restart()
            assert await eventually(_up(state))
            await asyncio.sleep(0.3)
            assert await returns(state.stop())
    lines = _lines(caplog, _SHARED)
    assert sum("Redis unreachable" in line for line in lines) == 1
    assert sum("Redis reachable" in line for line in lines) == 1


async def test_a_reads_resync_keeps_no_instance_that_the_counts_round_forgot_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with running_redis() as server:
        state = redis_state(server.url)
        state._positions = {"gone": b"5-0", "kept": b"5-0"}
        pipeline = state._reader.pipeline

        def forgetting_pipeline(**options: Any) -> Any:
            pipe = pipeline(**options)
            execute = pipe.execute

            async def execute_then_forget() -> Any:
                replies = await execute()
                del state._positions["gone"]  # it left the registry while the reader waited
                return replies

            monkeypatch.setattr(pipe, "execute", execute_then_forget)
            return pipe

        monkeypatch.setattr(state._reader, "pipeline", forgetting_pipeline)
        try:
            await state._resync_positions()
        finally:
            assert await returns(state.stop())
    assert state._positions == {"kept": b"0-0"}  # its stream is gone: read from its start


async def _both_report(url: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings of the shared state and of the rate limits, each given ``url``; checks
    that both fail open."""
    errors = Counter("errors", "", registry=CollectorRegistry())
    limits = RedisStore(url, errors)
    state = redis_state(url)
    with caplog.at_level(logging.WARNING):
        await started(state, routing_fleet())
        assert await limits.take(["{t}:requests"], [Limit(1)], [1]) is None  # served
        await asyncio.sleep(0.5)
        assert not state.up
        assert await returns(state.stop())
        await limits.close()
    return _lines(caplog, _SHARED) + _lines(caplog, _LIMITS)


async def test_a_wrong_password_is_reported_as_such_and_limits_stay_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_redis() as server:
        admin = aioredis.from_url(server.url)
        await admin.config_set("requirepass", "right-password")
        await admin.aclose()
        lines = await _both_report(f"redis://:wrong-password@127.0.0.1:{server.port}/0", caplog)
    assert len(lines) == 2  # one each, though every round retries
    assert all("Redis authentication failed (AuthenticationError)" in line for line in lines)


@pytest.fixture
def untrusted_certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its key: no default trust store holds it."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextlib.asynccontextmanager
async def _tls_server(cert: Path, key: Path) -> AsyncIterator[int]:
    """A TLS listener presenting ``cert``; its port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_an_untrusted_tls_certificate_is_reported_as_such_and_limits_stay_off(
    caplog: pytest.LogCaptureFixture, untrusted_certificate: tuple[Path, Path]
) -> None:
    async with _tls_server(*untrusted_certificate) as port:
        lines = await _both_report(f"rediss://127.0.0.1:{port}/0", caplog)
    assert len(lines) == 2
    assert all("Redis TLS verification failed" in line for line in lines)
