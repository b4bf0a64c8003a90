"""The interface of a shared-state backend, and the outbox the request path writes to."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from router_policies.fingerprint import RequestFeatures

if TYPE_CHECKING:
    from gateway.affinity import RoutingMemory
    from gateway.state import Fleet

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


class SharedState:
    """A backend: started with the live fleet (re-read each round, so reloads are followed)."""

    backend: str = "local"

    def share_memory(self, memory: RoutingMemory) -> None:
        """Tell the other processes where this one's stored responses are, and ask them for
        the ones it does not know (vLLM keeps a stored response on the one replica that made
        it, and a client's next call may reach any process); learn from their dispatches
        which replicas served which LoRA adapter."""

    async def start(self, fleet: Callable[[], Fleet]) -> None:
        """Begin sharing; never raises for an unreachable backend (the gateway serves anyway)."""

    async def stop(self) -> None:
        """Stop the background tasks and withdraw this instance's figures."""

    @property
    def up(self) -> bool:
        return True
