"""Requests waiting in the gateway for a replica slot of a saturated pool."""

from __future__ import annotations

import asyncio
from collections import deque


class PoolSaturated(Exception):
    """No replica slot freed up within the pool's queue timeout."""


class PoolQueue:
    """Requests waiting in the gateway for a replica slot, first come first served."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout_s: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
