"""The outbox the request path writes its dispatches to, for a shared-state backend to
publish (gateway/shared_state/). A module of its own: pool state (gateway/fleet/pools.py) holds one,
and the backends read it, without either importing the other."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from router_policies.fingerprint import RequestFeatures

OUTBOX_LIMIT = 20_000
"""Dispatches kept for publishing while the backend is away; the oldest go first (soft state)."""

Sent = tuple[float, str, str, RequestFeatures]
"""One dispatch to share: (wall-clock time, pool, replica, the request's features)."""


class Outbox:
    """Dispatches waiting to be published. The request path only appends and sets a flag
    (which wakes an idle publisher); it never waits."""

    __slots__ = ("_filled", "_sent")

    def __init__(self, limit: int = OUTBOX_LIMIT) -> None:
        self._sent: deque[Sent] = deque(maxlen=limit)
        self._filled = asyncio.Event()

    def __len__(self) -> int:
        return len(self._sent)

    def dispatched(self, pool: str, replica: str, features: RequestFeatures) -> None:
        self._sent.append((time.time(), pool, replica, features))
        self._filled.set()

    async def filled(self) -> None:
        """Returns once there is something to publish: an idle publisher sleeps rather than
        wake every interval to find nothing (each wake-up costs CPU on a busy host)."""
        await self._filled.wait()

    def peek(self, limit: int) -> list[Sent]:
        sent = self._sent
        return [sent[i] for i in range(min(limit, len(sent)))]

    def drop(self, count: int) -> None:
        for _ in range(min(count, len(self._sent))):
            self._sent.popleft()
        if not self._sent:
            self._filled.clear()
