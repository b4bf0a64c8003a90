"""Requests waiting in the gateway for a replica slot of a saturated pool."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class PoolSaturated(Exception):
    """No replica slot freed up within the pool's queue timeout, or (``shed``) none was free
    for a sheddable request, which never waits."""

    def __init__(self, pool: str, *, shed: bool = False) -> None:
        super().__init__(pool)
        self.pool = pool
        self.shed = shed


class PoolQueue:
    """Requests waiting in the gateway for a replica slot: the highest priority first, first
    come first served within one."""

    def __init__(self) -> None:
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiters)

    def ahead_of(self, priority: int) -> bool:
        """Whether a request of ``priority`` would queue behind one already waiting."""
        return any(-rank >= priority for rank, _, _ in self._waiters)

    async def wait(self, timeout_s: float, priority: int = 0) -> None:
        waiter = asyncio.get_running_loop().create_future()
        entry = (-priority, next(self._order), waiter)
        heapq.heappush(self._waiters, entry)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)

    def wake_one(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
                return
