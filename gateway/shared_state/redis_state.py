"""The Redis backend: what each instance dispatched, and its counts, shared in the background.

- Dispatches: every ``publish_interval_s`` the outbox is sent as one entry of a stream
  (XADD, MAXLEN ~ bounded); every instance reads the stream (XREAD BLOCK) and replays the
  other instances' dispatches into its own pools: the selection policy's ``record`` (the
  prefix index, the hot-prefix counts) and the replica's recent-dispatch count.
- Counts: every ``sync_interval_s`` this instance writes its hash (in-flight per replica,
  waiting, arrivals, completions) with a TTL of ``ttl_s`` and reads the others' hashes: a dead
  instance's counts expire with its hash.
- Redis away or slow (a timeout of ``timeout_s``): one warning, gateway_state_backend_up 0,
  routing on local state only, retries with backoff up to ``_MAX_BACKOFF_S``; on return one
  info line, and what the outbox kept meanwhile is published (resync).
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

import orjson
import redis.asyncio as aioredis
from prometheus_client import Gauge, Histogram
from redis.exceptions import RedisError

from gateway.background import finish_within, stop_tasks
from gateway.shared_state import codec
from gateway.shared_state.base import Outbox, SharedState
from gateway.shared_state.figures import RemoteFigures, own_figures
from router_policies.schema import StateSettings

if TYPE_CHECKING:
    from gateway.state import Fleet

log = logging.getLogger(__name__)

_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
_BATCH_LIMIT = 2000
"""Most dispatches in one stream entry."""
_READ_COUNT = 100
"""Most stream entries read at once."""
_MAX_AGE_S = 60.0
"""A dispatch older than this when it arrives (kept through an outage) is not replayed."""
_INSTANCES_FORGET_S = 600.0
_REPLAY_S = 5.0
"""How far back an instance starts reading the stream when another instance appears."""
_FAILURES = (RedisError, OSError, TimeoutError)
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


class _Link:
    """Whether Redis answers: logs the change once each way, and spaces out the retries."""

    def __init__(self, up_gauge: Gauge) -> None:
        self.up = False
        self.epoch = 0
        """Counts the returns of Redis after an outage (and the first connection)."""
        self._gauge = up_gauge
        self._backoff = 0.0
        self._next_try = 0.0
        self._ever = False

    async def wait_turn(self) -> None:
        delay = self._next_try - time.monotonic()
        if not self.up and delay > 0:
            await asyncio.sleep(delay)

    def ok(self) -> None:
        if self.up:
            return
        self.up = True
        self.epoch += 1
        self._backoff = 0.0
        self._gauge.set(1)
        if self._ever:
            log.warning("shared state: Redis is back; sharing again")
        self._ever = True

    def failed(self, exc: BaseException) -> None:
        if self.up or (not self._ever and self._backoff == 0.0):
            log.warning(
                "shared state: Redis unreachable (%s); serving from local state, retrying",
                type(exc).__name__,
            )
        self.up = False
        self._gauge.set(0)
        self._backoff = min(max(self._backoff * 2, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
        self._next_try = time.monotonic() + self._backoff


class RedisState(SharedState):
    backend = "redis"

    def __init__(self, settings: RedisSettings, outbox: Outbox, up: Gauge, lag: Histogram) -> None:
        self.settings = settings
        self.outbox = outbox
        self.instance = instance_id()
        self._lag = lag
        self._link = _Link(up)
        prefix = settings.key_prefix
        self._stream = f"{prefix}:dispatches"
        self._instances = f"{prefix}:instances"
        self._own_key = self._figures_key(self.instance)
        self._remote = RemoteFigures()
        self._client: aioredis.Redis = aioredis.from_url(
            settings.url,
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            retry=None,
            retry_on_timeout=False,
            decode_responses=False,
        )
        # XREAD BLOCK holds its connection: a client of its own, whose timeout covers the block.
        self._reader: aioredis.Redis = aioredis.from_url(
            settings.url,
            socket_timeout=settings.timeout_s + self._block_ms / 1000,
            socket_connect_timeout=settings.timeout_s,
            retry=None,
            retry_on_timeout=False,
            decode_responses=False,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._last_id: bytes = b""
        """Last stream entry read; empty: not reading (alone), start _REPLAY_S back."""
        self._read_epoch = 0
        self._alone = True
        """No other instance wrote its counts lately: nothing to read from the stream."""

    @property
    def up(self) -> bool:
        return self._link.up

    @property
    def _block_ms(self) -> int:
        return 100

    def _figures_key(self, instance: str) -> str:
        return f"{self.settings.key_prefix}:instance:{instance}"

    async def start(self, fleet: Callable[[], Fleet]) -> None:
        fleet().attach(self.outbox)
        s = self.settings
        self._tasks = [
            asyncio.create_task(
                self._every(s.publish_interval_s, self._publish, fleet), name="shared-state publish"
            ),
            asyncio.create_task(self._every(0.0, self._read, fleet), name="shared-state read"),
            asyncio.create_task(
                self._every(s.sync_interval_s, self._sync, fleet), name="shared-state sync"
            ),
        ]

    async def stop(self) -> None:
        # Bounded: a round's command can lose its cancellation (see gateway.background), and a
        # Redis that stopped answering must not hold the process past its grace period.
        await stop_tasks(self._tasks)
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
        self, interval: float, step: Callable[[Fleet], Awaitable[bool]], fleet: Callable[[], Fleet]
    ) -> None:
        """Runs ``step`` forever; a step returns whether it reached Redis, since one that had
        nothing to send proves nothing: counted as an answer, it flipped the link up and down
        (a log line each way, every retry) while Redis was away."""
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
                if reached:
                    self._link.ok()
            if interval > 0:
                await asyncio.sleep(interval)

    # -- dispatches ---------------------------------------------------------------------------

    async def _publish(self, fleet: Fleet) -> bool:
        sent = False
        while len(self.outbox):
            batch = self.outbox.peek(_BATCH_LIMIT)
            payload = orjson.dumps(
                {
                    "f": codec.FIELDS,
                    "d": [[t, pool, rep, codec.encode(feat)] for t, pool, rep, feat in batch],
                }
            )
            await self._client.xadd(
                self._stream,
                {"i": self.instance, "d": payload},
                maxlen=self.settings.stream_maxlen,
                approximate=True,
            )
            self.outbox.drop(len(batch))
            sent = True
        return sent

    async def _read(self, fleet: Fleet) -> bool:
        if self._alone:
            # Only our own entries there: skip reading them back. Once another instance
            # appears, start a few seconds back, so what it published before we noticed it
            # (its first dispatches; or, for a newcomer, the fleet's recent ones) is replayed.
            self._last_id = b""
            await asyncio.sleep(self._block_ms / 1000)
            return False
        if not self._last_id:
            seconds, micros = await self._reader.time()
            since_ms = max(seconds * 1000 + micros // 1000 - int(_REPLAY_S * 1000), 0)
            self._last_id = f"{since_ms}-0".encode()
            self._read_epoch = self._link.epoch
        elif self._read_epoch != self._link.epoch:
            await self._resync_position()
        reply: Any = await self._reader.xread(
            {self._stream: self._last_id}, count=_READ_COUNT, block=self._block_ms
        )
        if not reply:
            return True
        own = self.instance.encode()
        for _stream, entries in reply:
            for entry_id, fields in entries:
                self._last_id = entry_id
                if fields.get(b"i") == own:
                    continue
                self._apply(fleet, fields.get(b"d", b"{}"))
        return True

    async def _resync_position(self) -> None:
        """Where to read from: on from the last entry read, unless the stream is younger than
        that (Redis restarted and lost it), then from its start."""
        newest: Any = await self._reader.xrevrange(self._stream, count=1)
        newest_id: bytes = newest[0][0] if newest else b"0-0"
        if _stream_id(newest_id) < _stream_id(self._last_id):
            self._last_id = b"0-0"
        self._read_epoch = self._link.epoch

    def _apply(self, fleet: Fleet, raw: bytes) -> None:
        try:
            batch: dict[str, Any] = orjson.loads(raw)
            names = list(batch["f"])
            records = batch["d"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        wall = time.time()
        now = time.monotonic()
        for record in records:
            try:
                sent_at, pool_name, replica, values = record
            except (TypeError, ValueError):
                continue
            age = max(wall - float(sent_at), 0.0)
            self._lag.observe(age)
            if age > _MAX_AGE_S:
                continue
            pool = fleet.pools.get(pool_name)
            features = codec.decode(names, values)
            if pool is None or features is None:
                continue
            pool.apply_remote_dispatch(replica, features, now - age)

    # -- counts -------------------------------------------------------------------------------

    async def _sync(self, fleet: Fleet) -> bool:
        ttl_ms = int(self.settings.ttl_s * 1000)
        wall = time.time()
        mine = own_figures(fleet)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self._own_key)
        if mine:
            pipe.hset(self._own_key, mapping=mine)  # type: ignore[arg-type]
        pipe.pexpire(self._own_key, ttl_ms)
        pipe.zadd(self._instances, {self.instance: wall})
        pipe.zremrangebyscore(self._instances, 0, wall - _INSTANCES_FORGET_S)
        pipe.zrange(self._instances, 0, -1)
        replies = await pipe.execute()
        others = [m.decode() for m in replies[-1] if m.decode() != self.instance]
        read = self._client.pipeline(transaction=False)
        for other in others:
            read.hgetall(self._figures_key(other))
        hashes = await read.execute() if others else []
        figures = {
            other: {k.decode(): v.decode() for k, v in fields.items()}
            for other, fields in zip(others, hashes, strict=True)
            if fields
        }
        self._alone = not figures  # the others' hashes expire with them
        self._remote.apply(fleet, figures)
        return True


def _stream_id(raw: bytes) -> tuple[int, int]:
    ms, _, seq = raw.partition(b"-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (0, 0)
