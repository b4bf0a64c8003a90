"""The workers of one `serve --workers N` share routing state without Redis, over Unix sockets.

Each worker listens on its own socket in a directory the parent made for this run (mode 0700:
only this user can connect, unlike an abstract socket) and keeps one connection to each other
worker. What travels is what the Redis backend shares, the same bytes (gateway/shared_state/
replay.py): this worker's dispatches, at once after a quiet spell, then at most every
``publish_interval_s``; its counts every ``sync_interval_s``. Nothing waits for an answer, so a
message costs one write here and one read there, against a round trip to Redis and back.

A worker that is behind (more than ``_BACKLOG_BYTES`` not yet taken by the kernel) misses
messages rather than slow the sender: the state is soft. A worker that ends closes its
connections and the others forget its counts at once; one that hangs is forgotten when its
counts are ``ttl_s`` old. Only this pod's workers share: instances in other pods see nothing
without Redis.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from prometheus_client import Gauge, Histogram

from gateway.background import STOP_BOUND_S, stop_tasks
from gateway.shared_state import responses
from gateway.shared_state.base import SharedState
from gateway.shared_state.figures import RemoteFigures, own_figures
from gateway.shared_state.outbox import Outbox
from gateway.shared_state.replay import apply_batch, encode_batch

if TYPE_CHECKING:
    from gateway.fleet.pools import Fleet
    from gateway.routing.affinity import AdapterHomes, ReplicaRef, ResponseHomes, RoutingMemory

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!cI")
"""Each message: its kind, the payload's length."""
DISPATCHES, COUNTS, RESPONSE, LARGE = b"d", b"c", b"r", b"l"
_BATCH_LIMIT = 2000
"""Most dispatches in one message."""
_BACKLOG_BYTES = 4 << 20
"""Unsent bytes to one worker beyond which messages to it are dropped until it catches up."""
_MAX_MESSAGE_BYTES = 64 << 20
"""Larger is not a message a worker sends (2000 dispatches at most): the stream is garbled."""
_FIRST_RETRY_S = 0.05
_MAX_RETRY_S = 1.0
_HOME_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class MeshPlace:
    """Where one worker of `serve --workers N` sits: its place among the workers and the run's
    private directory, given by the parent before it forks the worker. Its sockets there: the
    mesh's (routing state, when no Redis is configured) and its /metrics for its siblings
    (gateway/telemetry/pod_metrics.py)."""

    directory: Path
    workers: int
    index: int

    def socket_path(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    def metrics_socket_path(self, index: int) -> Path:
        return self.directory / f"metrics-{index}.sock"


@dataclass(frozen=True, slots=True)
class MeshSettings:
    publish_interval_s: float
    sync_interval_s: float
    ttl_s: float


class _Peer:
    """The connection to one other worker, opened on first use and again after it drops."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writer: asyncio.StreamWriter | None = None
        self._retry_at = 0.0
        self._retry_s = _FIRST_RETRY_S

    @property
    def connected(self) -> bool:
        return self.writer is not None and not self.writer.is_closing()

    async def connect(self) -> None:
        if self.connected or time.monotonic() < self._retry_at:
            return
        try:
            _, self.writer = await asyncio.open_unix_connection(str(self.path))
        except OSError:
            # Not listening yet (starting), or gone (being replaced): try again later.
            self.writer = None
            self._retry_at = time.monotonic() + self._retry_s
            self._retry_s = min(2 * self._retry_s, _MAX_RETRY_S)
            return
        self._retry_s = _FIRST_RETRY_S

    def send(self, frame: bytes) -> None:
        writer = self.writer
        if writer is None or writer.is_closing():
            return
        if writer.transport.get_write_buffer_size() > _BACKLOG_BYTES:
            return  # that worker is not reading: soft state, drop rather than pile up
        writer.write(frame)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class WorkerMesh(SharedState):
    backend = "workers"

    def __init__(
        self, place: MeshPlace, settings: MeshSettings, outbox: Outbox, up: Gauge, lag: Histogram
    ) -> None:
        self.place = place
        self.settings = settings
        self.outbox = outbox
        self._up = up
        self._lag = lag
        self._peers = {
            index: _Peer(place.socket_path(index))
            for index in range(place.workers)
            if index != place.index
        }
        self._figures: dict[str, tuple[float, dict[str, int]]] = {}
        """The other workers' latest counts, by worker, with when they arrived."""
        self._remote = RemoteFigures(settings.sync_interval_s)
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._readers: set[asyncio.Task[None]] = set()
        self._incoming: set[asyncio.StreamWriter] = set()
        """The other workers' connections to this one, closed on stop."""
        self._homes: ResponseHomes | None = None
        self._adapters: AdapterHomes | None = None

    @property
    def up(self) -> bool:
        return all(peer.connected for peer in self._peers.values())

    def share_memory(self, memory: RoutingMemory) -> None:
        self._adapters = memory.adapters
        homes = self._homes = memory.responses
        homes.publish = self._publish_home
        homes.fetch = self._await_home
        # Pushed, not asked for: a sibling's message lands in the tier model's memory within a
        # millisecond, long before the conversation's next turn (it waits for this answer).
        memory.large_conversations.publish = self._publish_large

    def _publish_home(self, response_id: str, home: ReplicaRef) -> None:
        self._to_all(frame(RESPONSE, responses.encode(response_id, home)))

    def _publish_large(self, model: str, conversation: int) -> None:
        self._to_all(frame(LARGE, orjson.dumps([model, conversation])))

    def _to_all(self, message: bytes) -> None:
        for peer in self._peers.values():
            peer.send(message)

    async def _await_home(self, response_id: str) -> ReplicaRef | None:
        """The home, if a sibling's message naming it arrives within MESH_WAIT_S."""
        homes = self._homes
        deadline = time.monotonic() + responses.MESH_WAIT_S
        while homes is not None and time.monotonic() < deadline:
            await asyncio.sleep(_HOME_POLL_S)
            home = homes.get(response_id)
            if home is not None:
                return home
        return None

    async def start(self, fleet: Callable[[], Fleet]) -> None:
        fleet().attach(self.outbox)
        path = self.place.socket_path(self.place.index)
        # A replaced worker's socket file is still there: binding needs the name free.
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(
            lambda r, w: self._serve_peer(r, w, fleet), path=str(path)
        )
        s = self.settings
        self._tasks = [
            asyncio.create_task(
                self._every(s.publish_interval_s, self._publish), name="worker mesh publish"
            ),
            asyncio.create_task(
                self._every(s.sync_interval_s, lambda: self._sync(fleet())),
                name="worker mesh sync",
            ),
        ]

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        if self._server is not None:
            self._server.close()
        for peer in self._peers.values():
            peer.close()
        # Closed, not cancelled: each reader then ends at its end of stream (a reader the
        # server started and that ends cancelled is logged as an error by asyncio on 3.11).
        for writer in self._incoming:
            writer.close()
        if self._readers:
            await asyncio.wait(self._readers, timeout=STOP_BOUND_S)
        self._up.set(0)

    async def _every(self, interval: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await step()
            except Exception:  # a bug here must not stop the sharing (nor the gateway)
                log.exception("worker mesh: round failed")
                await asyncio.sleep(1.0)
            await asyncio.sleep(interval)

    async def _publish(self) -> None:
        await self.outbox.filled()
        while len(self.outbox):
            batch = self.outbox.peek(_BATCH_LIMIT)
            self._to_all(frame(DISPATCHES, encode_batch(batch)))
            self.outbox.drop(len(batch))

    async def _sync(self, fleet: Fleet) -> None:
        # Connecting here only: one task, so a peer never gets two connections from us.
        for peer in self._peers.values():
            await peer.connect()
        self._up.set(1 if self.up else 0)
        mine = orjson.dumps({"w": str(self.place.index), "f": own_figures(fleet)})
        self._to_all(frame(COUNTS, mine))
        oldest = time.monotonic() - self.settings.ttl_s
        live = {w: figures for w, (at, figures) in self._figures.items() if at >= oldest}
        self._remote.apply(fleet, live)

    async def _serve_peer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, fleet: Callable[[], Fleet]
    ) -> None:
        """Reads one other worker's messages until it goes; then its counts go with it."""
        task = asyncio.current_task()
        assert task is not None
        self._readers.add(task)
        self._incoming.add(writer)
        sender: str | None = None
        try:
            while True:
                kind, length = _HEADER.unpack(await reader.readexactly(_HEADER.size))
                if length > _MAX_MESSAGE_BYTES:
                    log.warning(
                        "worker mesh: a message of %d bytes; closing its connection", length
                    )
                    return
                payload = await reader.readexactly(length)
                if kind == DISPATCHES:
                    apply_batch(fleet(), payload, self._lag, self._adapters)
                    await asyncio.sleep(0)  # a backlog read at once must not hold up requests
                elif kind == COUNTS:
                    sender = self._counts(payload) or sender
                elif kind == RESPONSE and self._homes is not None:
                    learned = responses.decode(payload)
                    if learned is not None:
                        self._homes.learn(*learned)
                elif kind == LARGE:
                    _went_large(fleet(), payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._readers.discard(task)
            self._incoming.discard(writer)
            if sender is not None:
                self._figures.pop(sender, None)
            writer.close()

    def _counts(self, payload: bytes) -> str | None:
        try:
            message = orjson.loads(payload)
            sender, figures = str(message["w"]), dict(message["f"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        self._figures[sender] = (time.monotonic(), figures)
        return sender


def _went_large(fleet: Fleet, payload: bytes) -> None:
    """A sibling sent a conversation large: its tier model here remembers it too."""
    try:
        model, conversation = orjson.loads(payload)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return
    tiers = fleet.tiers.get(model) if isinstance(model, str) else None
    if tiers is not None and isinstance(conversation, int):
        tiers.remember(conversation)
