"""The workers of one `serve --workers N` share routing state without Redis, over Unix sockets:
a dispatch through one is a prefix hit through the other, each counts the other's requests in
flight, a worker that goes is forgotten at once, one that stops reading never holds the
sender up, one that starts late is joined, and a conversation one sent large is large on the
other. (Real worker processes: tests/test_workers.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram

from gateway.fleet.pools import Fleet
from gateway.routing.affinity import RoutingMemory
from gateway.shared_state import Outbox
from gateway.shared_state.worker_mesh import _BACKLOG_BYTES, MeshPlace, MeshSettings, WorkerMesh
from tests.conftest import eventually
from tests.shared_state import (
    NAMES,
    SYSTEM,
    dispatch_away_from_home,
    features,
    fleet,
    pool_of,
    returns,
    routes_to,
)
from tests.tiers import fleet as tiered_fleet


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A socket directory with a short path: a Unix socket's path has ~100 bytes at most, and
    pytest's tmp_path with a long test name can exceed that."""
    directory = Path(tempfile.mkdtemp(prefix="mesh-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


SETTINGS = MeshSettings(publish_interval_s=0.015, sync_interval_s=0.05, ttl_s=2.0)


def worker(directory: Path, index: int, workers: int = 2) -> WorkerMesh:
    registry = CollectorRegistry()
    up = Gauge("up", "all peers connected", registry=registry)
    lag = Histogram("lag", "dispatch age on arrival", registry=registry)
    return WorkerMesh(MeshPlace(directory, workers, index), SETTINGS, Outbox(), up, lag)


@contextlib.asynccontextmanager
async def mesh(directory: Path, *fleets: Fleet) -> AsyncIterator[list[WorkerMesh]]:
    workers = [worker(directory, i, len(fleets)) for i in range(len(fleets))]
    for w, f in zip(workers, fleets, strict=True):
        await w.start(lambda f=f: f)  # type: ignore[misc]
    try:
        yield workers
    finally:
        for w in workers:
            assert await returns(w.stop())


async def test_a_prefix_one_worker_sent_somewhere_is_a_prefix_hit_through_the_other(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    here, there = fleet(), fleet()
    async with mesh(short_dir, here, there) as workers:
        assert await eventually(lambda: _all_up(workers))
        request, chosen = dispatch_away_from_home(pool_of(here))
        assert await eventually(routes_to(pool_of(there), request, chosen))
    await asyncio.sleep(0.05)  # what the loop runs after the stop, asyncio's callbacks among it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a quiet stop


async def test_each_worker_counts_the_others_requests_in_flight_and_forgets_one_that_ends(
    short_dir: Path,
) -> None:
    here, there, third = fleet(), fleet(), fleet()
    async with mesh(short_dir, here, there, third) as workers:
        pool_of(here).replicas[NAMES[0]].inflight = 3
        pool_of(third).replicas[NAMES[0]].inflight = 2
        seen = pool_of(there).replicas[NAMES[0]]

        async def counted(value: int) -> bool:
            return seen.remote_inflight == value

        assert await eventually(lambda: counted(5))
        await workers[0].stop()
        # At once, not when its counts would have aged out (ttl_s, 2 s).
        started = time.monotonic()
        assert await eventually(lambda: counted(2))
        assert time.monotonic() - started < SETTINGS.ttl_s


async def test_a_worker_that_stops_reading_never_holds_up_or_swamps_the_sender(
    short_dir: Path,
) -> None:
    here = fleet()
    # The other worker's socket accepts connections (the kernel's backlog) but nobody reads.
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(str(MeshPlace(short_dir, 2, 1).socket_path(1)))
    stuck.listen()
    try:
        async with mesh_of_one(short_dir, here) as sender:
            assert await eventually(lambda: _all_up([sender]))
            pool = pool_of(here)
            request = features(pool, SYSTEM * 4)
            for _ in range(40):
                for _ in range(500):
                    sender.outbox.dispatched(pool.name, NAMES[1], request)
                await asyncio.sleep(SETTINGS.publish_interval_s)
            peer = sender._peers[1]
            assert peer.writer is not None
            assert peer.writer.transport.get_write_buffer_size() <= 2 * _BACKLOG_BYTES
            assert len(sender.outbox) < 1000  # published (to nobody), not piling up
    finally:
        stuck.close()


async def test_a_worker_that_starts_later_is_joined_and_learns_what_follows(
    short_dir: Path,
) -> None:
    early, late = fleet(), fleet()
    async with mesh_of_one(short_dir, early) as first:
        await asyncio.sleep(0.2)  # its first attempts to connect find nobody
        async with mesh_of_one(short_dir, late, index=1) as second:
            assert await eventually(lambda: _all_up([first, second]))
            request, chosen = dispatch_away_from_home(pool_of(early))
            assert await eventually(routes_to(pool_of(late), request, chosen))


@contextlib.asynccontextmanager
async def mesh_of_one(
    directory: Path, f: Fleet, index: int = 0, workers: int = 2
) -> AsyncIterator[WorkerMesh]:
    w = worker(directory, index, workers)
    await w.start(lambda: f)
    try:
        yield w
    finally:
        assert await returns(w.stop())


async def _all_up(workers: list[WorkerMesh]) -> bool:
    return all(w.up for w in workers)


async def test_a_conversation_one_worker_sent_large_is_large_on_the_other(
    short_dir: Path,
) -> None:
    here, there = tiered_fleet(0.0), tiered_fleet(0.0)
    memories = [RoutingMemory(), RoutingMemory()]
    async with mesh(short_dir, here, there) as workers:
        for w, memory in zip(workers, memories, strict=True):
            w.share_memory(memory)
        assert await eventually(lambda: _all_up(workers))
        conversation = 2**64 - 12345  # keys are unsigned 64-bit digests
        memories[0].large_conversations.tell(here.tiers["auto"], conversation)

        async def went_large() -> bool:
            return there.tiers["auto"].conversations.went_large(conversation)

        assert await eventually(went_large)
        assert not here.tiers["auto"].conversations.went_large(conversation)  # told, not kept
