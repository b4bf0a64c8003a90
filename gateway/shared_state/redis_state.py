"""The Redis backend: what each instance dispatched, and its counts, shared in the background.

- Dispatches: this instance's own stream gets the outbox as one entry (XADD, MAXLEN ~
  bounded; the stream expires ``MAX_AGE_S`` after its last entry) as soon as it holds a
  dispatch, then at most every ``publish_interval_s``: a quiet instance publishes a dispatch
  at once, a busy one in batches. Every instance reads the other live instances' streams (one
  XREAD BLOCK over them all) and replays their dispatches into its own pools: the selection
  policy's ``record`` (the prefix index, the hot-prefix counts) and the replica's
  recent-dispatch count. Why a stream per instance, and why no publishing round while the
  outbox is empty: each wake-up of a sharing task costs CPU (a few hundred microseconds on a
  busy 2-core host), and this way nobody wakes to read back its own entries or to find
  nothing to send.
- Counts: every ``sync_interval_s`` this instance writes its hash (in-flight per replica,
  waiting, arrivals, completions) with a TTL of ``ttl_s`` and reads the others' hashes, in one
  round trip: a dead instance's counts expire with its hash, and the instances whose hashes
  are live are the ones whose streams are read.
- Keys written without the request waiting: stored responses' homes, and the conversations a
  tier model sent large (looked up before a follow-up turn not known as large is scored).
- Redis away or slow (a timeout of ``timeout_s``), or refusing writes: one warning (saying
  which: link.py, redis_errors.py), gateway_state_backend_up 0, routing on local state only,
  retries with backoff; on return one line, and what the outbox kept meanwhile is published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from prometheus_client import Gauge, Histogram

from gateway.background import finish_within, stop_tasks
from gateway.routing.affinity import HomesUnavailable
from gateway.shared_state import responses
from gateway.shared_state.base import SharedState
from gateway.shared_state.figures import RemoteFigures, own_figures
from gateway.shared_state.link import Link
from gateway.shared_state.outbox import Outbox
from gateway.shared_state.redis_errors import FAILURES as _FAILURES
from gateway.shared_state.replay import MAX_AGE_S, apply_batch, encode_batch
from router_policies.schema import StateSettings

if TYPE_CHECKING:
    from gateway.fleet.pools import Fleet
    from gateway.routing.affinity import AdapterHomes, ReplicaRef, ResponseHomes, RoutingMemory

log = logging.getLogger(__name__)

_BATCH_LIMIT = 2000
"""Most dispatches in one stream entry."""
_READ_COUNT = 100
"""Most stream entries read at once."""
_INSTANCES_FORGET_S = 600.0
_REPLAY_S = 5.0
"""How far back an instance starts reading the stream when another instance appears."""
LARGE_TTL_S = 86_400
"""A conversation resumed within a day keeps its large tier; the keys (~80 bytes) stay bounded."""
MOST_WRITES = 32
"""Background writes (response homes, large conversations) in flight at once: each holds one of
the client's connections (redis-py's pool has 100), which the counts and publish rounds need
too; past it Redis is slower than the requests come, and the rest is known here only."""
_BLOCK_MS = 100
"""Longest wait of one XREAD: how soon the reader notices a new instance."""
_WITHDRAW_S = 1.0
"""Most time stopping gives to withdrawing this instance's counts and closing the connections:
a courtesy (the counts expire at their TTL anyway), not worth holding the exit for."""


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    key_prefix: str = StateSettings().key_prefix
    publish_interval_s: float = 0.015
    sync_interval_s: float = 0.075
    ttl_s: float = 2.0
    timeout_s: float = 0.5
    stream_maxlen: int = 10_000
    """Stream entries kept (each a batch of dispatches): the backlog's bound."""


def instance_id() -> str:
    """Unique per process: host, pid, and a random part (pids repeat across pods)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class RedisState(SharedState):
    backend = "redis"

    def __init__(self, settings: RedisSettings, outbox: Outbox, up: Gauge, lag: Histogram) -> None:
        self.settings = settings
        self.outbox = outbox
        self.instance = instance_id()
        self._lag = lag
        self._link = Link(up, log)
        prefix = settings.key_prefix
        self._instances = f"{prefix}:instances"
        self._own_key = self._figures_key(self.instance)
        self._own_stream = self._stream_key(self.instance)
        self._remote = RemoteFigures(settings.sync_interval_s)
        self._client = self._connect(settings.timeout_s)
        # XREAD BLOCK holds its connection: a client of its own, whose timeout covers the block.
        self._reader = self._connect(settings.timeout_s + _BLOCK_MS / 1000)
        self._tasks: list[asyncio.Task[None]] = []
        self._members: list[str] = []
        """The other instances in the registry at the last counts round."""
        self._live: list[str] = []
        """The other instances whose counts were live at the last counts round: the streams
        to read."""
        self._positions: dict[str, bytes] = {}
        """Last entry read from each other instance's stream; a newcomer starts _REPLAY_S
        back. Kept while the instance stays in the registry, so one that drops out of the live
        set for a moment is not replayed twice."""
        self._read_epoch = 0
        self._adapters: AdapterHomes | None = None
        self._homes: ResponseHomes | None = None
        self._keep_owner = self._client.register_script(responses.KEEP_OWNER)
        self._writes: set[asyncio.Task[None]] = set()
        """Keys being written (the request path does not wait for them)."""

    def _connect(self, timeout_s: float) -> aioredis.Redis:
        return aioredis.from_url(
            self.settings.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=self.settings.timeout_s,
            retry=None,
            retry_on_timeout=False,
            decode_responses=False,
        )

    @property
    def up(self) -> bool:
        return self._link.up

    def _figures_key(self, instance: str) -> str:
        return f"{self.settings.key_prefix}:instance:{instance}"

    def _stream_key(self, instance: str) -> str:
        return f"{self.settings.key_prefix}:dispatches:{instance}"

    def _response_key(self, response_id: str) -> str:
        return f"{self.settings.key_prefix}:response:{response_id}"

    def _large_key(self, model: str, conversation: int) -> str:
        return f"{self.settings.key_prefix}:large:{model}:{conversation:x}"

    # -- stored responses and large conversations -----------------------------------------

    def share_memory(self, memory: RoutingMemory) -> None:
        self._adapters = memory.adapters
        self._homes = memory.responses
        memory.responses.publish = self._publish_home
        memory.responses.fetch = self._fetch_home
        memory.large_conversations.publish = self._publish_large
        memory.large_conversations.fetch = self._fetch_large

    def _publish_home(self, response_id: str, home: ReplicaRef) -> None:
        key, homes = self._response_key(response_id), self._homes
        if homes is not None:
            self._soon(lambda: responses.claim(self._keep_owner, key, response_id, home, homes))

    def _publish_large(self, model: str, conversation: int) -> None:
        key = self._large_key(model, conversation)
        self._soon(lambda: self._client.set(key, b"1", ex=LARGE_TTL_S))

    def _soon(self, write: Callable[[], Awaitable[object]]) -> None:
        """In the background, the request not waiting; with Redis away, or too slow to keep up
        (MOST_WRITES in flight), only this one knows it."""
        if not self._link.up or len(self._writes) >= MOST_WRITES:
            return
        task = asyncio.create_task(self._quietly(write))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @staticmethod
    async def _quietly(write: Callable[[], Awaitable[object]]) -> None:
        with contextlib.suppress(*_FAILURES):
            await write()

    async def _fetch_large(self, model: str, conversation: tuple[int, ...]) -> bool:
        """Whether any of the conversation's keys went large: one round trip for all."""
        if not self._link.up:
            return False
        try:
            keys = [self._large_key(model, key) for key in conversation]
            return bool(await self._client.exists(*keys))
        except _FAILURES:
            return False

    async def _fetch_home(self, response_id: str) -> ReplicaRef | None:
        if len(response_id) > responses.MAX_ID_CHARS:
            return None
        if not self._link.up:
            raise HomesUnavailable("Redis is unreachable")
        key = self._response_key(response_id)
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(responses.REDIS_RETRY_S)
            try:
                raw = await self._client.get(key)
            except _FAILURES as exc:
                raise HomesUnavailable(f"Redis failed: {type(exc).__name__}") from None
            # decode_responses=False: bytes, whatever the client's stubs say.
            found = responses.decode(raw) if isinstance(raw, bytes) else None
            if found is not None and found[0] == response_id:
                return found[1]
        return None

    async def start(self, fleet: Callable[[], Fleet]) -> None:
        fleet().attach(self.outbox)
        s = self.settings
        self._tasks = [
            asyncio.create_task(
                self._every(s.publish_interval_s, self._publish, fleet), name="shared-state publish"
            ),
            asyncio.create_task(
                self._every(0.0, self._read, fleet, writes=False), name="shared-state read"
            ),
            asyncio.create_task(
                self._every(s.sync_interval_s, self._sync, fleet), name="shared-state sync"
            ),
        ]

    async def stop(self) -> None:
        # Bounded: a round's command can lose its cancellation (see gateway.background), and a
        # Redis that stopped answering must not hold the process past its grace period.
        await stop_tasks(self._tasks)
        await stop_tasks(list(self._writes))
        self._tasks = []
        if not await finish_within(self._withdraw(), _WITHDRAW_S):
            log.warning("shared state: Redis did not answer while stopping; gave up on it")

    async def _withdraw(self) -> None:
        with contextlib.suppress(*_FAILURES):
            # Withdraw this instance's counts at once rather than at the TTL.
            await self._client.delete(self._own_key)
            await self._client.zrem(self._instances, self.instance)
        for client in (self._client, self._reader):
            with contextlib.suppress(*_FAILURES):
                await client.aclose()

    async def _every(
        self,
        interval: float,
        step: Callable[[Fleet], Awaitable[bool]],
        fleet: Callable[[], Fleet],
        writes: bool = True,
    ) -> None:
        """Runs ``step`` forever; a step returns whether it reached Redis, since one that had
        nothing to send proves nothing: counted as an answer, it flipped the link up and down
        (a log line each way, every retry) while Redis was away. Nor does a step that only
        reads (``writes`` False): Redis may answer reads while it refuses every write."""
        while True:
            await self._link.wait_turn()
            try:
                reached = await step(fleet())
            except _FAILURES as exc:
                self._link.failed(exc)
                RemoteFigures.forget(fleet())
            except Exception:  # a bug here must not stop the sharing (nor the gateway)
                log.exception("shared state: round failed")
                await asyncio.sleep(1.0)
            else:
                if reached and writes:
                    self._link.ok()
            if interval > 0:
                await asyncio.sleep(interval)

    # -- dispatches ---------------------------------------------------------------------------

    async def _publish(self, fleet: Fleet) -> bool:
        await self.outbox.filled()
        sent = False
        while len(self.outbox):
            batch = self.outbox.peek(_BATCH_LIMIT)
            payload = encode_batch(batch)
            pipe = self._client.pipeline(transaction=True)
            pipe.xadd(
                self._own_stream,
                {"d": payload},
                maxlen=self.settings.stream_maxlen,
                approximate=True,
            )
            pipe.pexpire(self._own_stream, int(MAX_AGE_S * 1000))
            await pipe.execute()
            self.outbox.drop(len(batch))
            sent = True
        return sent

    async def _read(self, fleet: Fleet) -> bool:
        live = self._live
        if not live:
            # Alone: nothing to read. Once another instance appears, its stream is read from a
            # few seconds back, so what it published before we noticed it (its first
            # dispatches; or, for a newcomer, the fleet's recent ones) is replayed.
            await asyncio.sleep(_BLOCK_MS / 1000)
            return False
        if self._read_epoch != self._link.epoch:
            await self._resync_positions()
        new = [other for other in live if other not in self._positions]
        if new:
            seconds, micros = await self._reader.time()
            since_ms = max(seconds * 1000 + micros // 1000 - int(_REPLAY_S * 1000), 0)
            for other in new:
                self._positions[other] = f"{since_ms}-0".encode()
        # The counts round forgets the instances that left the registry, also while this one
        # awaited: only those still known are read.
        by_stream = {self._stream_key(o).encode(): o for o in live if o in self._positions}
        if not by_stream:
            await asyncio.sleep(_BLOCK_MS / 1000)  # as when alone, until the next counts round
            return False
        reply: Any = await self._reader.xread(
            {stream: self._positions[other] for stream, other in by_stream.items()},
            count=_READ_COUNT,
            block=_BLOCK_MS,
        )
        # XREAD answers only the streams it was asked for.
        for stream, entries in reply or ():
            sender = by_stream[stream]
            for entry_id, fields in entries:
                self._positions[sender] = entry_id
                apply_batch(fleet, fields.get(b"d", b"{}"), self._lag, self._adapters)
                # Between entries: the backlog kept through an outage (up to 2,000 dispatches
                # an entry, from every instance at once) must not hold up the requests.
                await asyncio.sleep(0)
        return True

    async def _resync_positions(self) -> None:
        """Where to read from once Redis is back: on from the last entry read, unless that
        instance's stream is now younger (Redis restarted and lost it), then from its start."""
        others = list(self._positions)
        pipe = self._reader.pipeline(transaction=False)
        for other in others:
            pipe.xrevrange(self._stream_key(other), count=1)
        newest: list[Any] = await pipe.execute() if others else []
        for other, entries in zip(others, newest, strict=True):
            newest_id: bytes = entries[0][0] if entries else b"0-0"
            # An instance the counts round forgot meanwhile (it left the registry) stays so.
            read = self._positions.get(other)
            if read is not None and _stream_id(newest_id) < _stream_id(read):
                self._positions[other] = b"0-0"
        self._read_epoch = self._link.epoch

    # -- counts -------------------------------------------------------------------------------

    async def _sync(self, fleet: Fleet) -> bool:
        ttl_ms = int(self.settings.ttl_s * 1000)
        wall = time.time()
        mine = own_figures(fleet)
        # The others' hashes are those of the registry's members at the previous round: an
        # instance that just joined is read from the next round on, one interval later.
        members = self._members
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self._own_key)
        if mine:
            pipe.hset(self._own_key, mapping=mine)  # type: ignore[arg-type]
        pipe.pexpire(self._own_key, ttl_ms)
        pipe.zadd(self._instances, {self.instance: wall})
        pipe.zremrangebyscore(self._instances, 0, wall - _INSTANCES_FORGET_S)
        pipe.zrange(self._instances, 0, -1)
        for other in members:
            pipe.hgetall(self._figures_key(other))
        replies = await pipe.execute()
        hashes = replies[len(replies) - len(members) :]
        registry = replies[len(replies) - len(members) - 1]
        self._members = [m.decode() for m in registry if m.decode() != self.instance]
        figures = {
            other: {k.decode(): v.decode() for k, v in fields.items()}
            for other, fields in zip(members, hashes, strict=True)
            if fields
        }
        self._live = list(figures)  # the others' hashes expire with them
        for gone in self._positions.keys() - set(self._members):
            del self._positions[gone]
        self._remote.apply(fleet, figures)
        return True


def _stream_id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (0, 0)
