"""Whether the shared state reaches Redis: gateway_state_backend_up, one log line each way,
and the retries spaced out while it does not.

Only a round that wrote to Redis proves the link up. A Redis that answers reads but refuses
writes (out of memory under ``maxmemory``, a replica after a failover) is down for sharing;
were a read enough, the reader's rounds and the writers' would flip the gauge and log both
ways many times a second.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Gauge

from gateway.shared_state.redis_errors import describe

_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0


class Link:
    def __init__(self, up_gauge: Gauge, log: logging.Logger) -> None:
        self.up = False
        self.epoch = 0
        """Counts the returns of Redis after an outage (and the first connection)."""
        self._gauge = up_gauge
        self._log = log
        """The sharing's own logger: its lines keep the name operators filter on."""
        self._backoff = 0.0
        self._next_try = 0.0
        self._ever = False
        self._warned = False
        """A failure was logged and no return since."""

    async def wait_turn(self) -> None:
        delay = self._next_try - time.monotonic()
        if not self.up and delay > 0:
            await asyncio.sleep(delay)

    def ok(self) -> None:
        """A round that wrote to Redis succeeded."""
        if self.up:
            return
        self.up = True
        self.epoch += 1
        self._backoff = 0.0
        self._gauge.set(1)
        if self._ever:
            self._log.warning("shared state: Redis is back; sharing again")
        elif self._warned:  # started while Redis was away: its first answer is its return
            self._log.warning("shared state: Redis reachable; sharing")
        else:
            self._log.info("shared state: Redis reachable; sharing")
        self._ever = True
        self._warned = False

    def failed(self, exc: BaseException) -> None:
        if not self._warned:
            self._log.warning(
                "shared state: Redis %s; serving from local state, retrying", describe(exc)
            )
            self._warned = True
        self.up = False
        self._gauge.set(0)
        self._backoff = min(max(self._backoff * 2, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
        self._next_try = time.monotonic() + self._backoff
