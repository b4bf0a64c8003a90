"""Subscriptions to the replicas' KV-cache events: one stream task per replica that publishes
(prefix.source auto or events, an endpoint configured), reconciled with the fleet every
second, so a policy reload or a replica's restart is picked up without restarting the gateway,
and a task that ended (it should not: it skips what it cannot read) is started again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.background import stop_tasks
from gateway.fleet.kv_event_stream import EventStream
from gateway.fleet.pools import Fleet

log = logging.getLogger(__name__)

_RECONCILE_S = 1.0


class KvEventSubscriptions:
    def __init__(self, current: Callable[[], Fleet]) -> None:
        self._current = current
        self._tasks: dict[EventStream, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.reconcile()
        self._loop = asyncio.create_task(self._every_second(), name="KV event subscriptions")

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        if self._loop is not None:
            tasks.append(self._loop)
        await stop_tasks(tasks)
        self._tasks.clear()

    async def _every_second(self) -> None:
        while True:
            await asyncio.sleep(_RECONCILE_S)
            self.reconcile()

    def reconcile(self) -> None:
        wanted: set[EventStream] = set()
        for pool, replica in self._current().replicas():
            where = pool.policy.events_endpoint(replica.url)
            if where is None:
                replica.kv_events = None
                continue
            settings = pool.policy.prefix.events
            stream = replica.kv_events
            if stream is None or (stream.endpoint, stream.replay, stream.topic) != (
                where.endpoint,
                where.replay,
                settings.topic,
            ):
                stream = replica.kv_events = EventStream(
                    where.endpoint, where.replay, settings.topic
                )
            stream.stall_s, stream.resync_s = settings.stall_s, settings.resync_s
            if not replica.healthy and not stream.unconfirmed and stream.next_seq is not None:
                log.info(
                    "replica %s is down: its KV-event index waits for its next message",
                    replica.name,
                )
                stream.went_down()
            exact = stream.exact(time.monotonic())
            if exact != stream.was_exact:
                stream.was_exact = exact
                log.info(
                    "replica %s: routing on its %s", replica.name,
                    "KV-cache events" if exact else "estimate (its event stream is not whole)",
                )  # fmt: skip
            wanted.add(stream)
            task = self._tasks.get(stream)
            if task is None or task.done():
                if task is not None:
                    _ended(stream, task, replica.name)
                self._tasks[stream] = asyncio.create_task(
                    stream.run(replica.name), name=f"KV events of {replica.name}"
                )
        for gone in [s for s in self._tasks if s not in wanted]:
            self._tasks.pop(gone).cancel()


def _ended(stream: EventStream, task: asyncio.Task[None], replica: str) -> None:
    """A backstop: a stream's task runs until cancelled, skipping what it cannot read, so one
    that ended met a bug. It is logged once here, and the replica subscribed to again, rather
    than its events ignored from then on; what it sent meanwhile, or what the failure left half
    applied, is unknown, so the index starts over as after a lost message."""
    error = None if task.cancelled() else task.exception()
    log.error(
        "KV events of replica %s: the subscription ended%s; subscribing again",
        replica, "" if error is None else f" on {error!r:.200}", exc_info=error,
    )  # fmt: skip
    stream.lost(time.monotonic(), replica)
