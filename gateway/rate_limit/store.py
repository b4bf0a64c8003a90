"""Where the buckets live: one small interface, an in-process store and a Redis one.

The local store is exact within one instance; N instances each enforce the full limit, so a
tenant can get up to N times it. The Redis store (redis_store.py) is one set of buckets for
every instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from router_policies.rate_limit import Bucket, Limit, Verdict, adjust, take


class BucketStore(Protocol):
    backend: str

    async def take(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Verdict | None:
        """Take every cost or none, atomically; None when the store cannot answer (the
        request is then served: limits fail open)."""
        ...

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        """Take ``delta`` more from one bucket (a refund when negative)."""
        ...

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        """adjust() where it needs no I/O (no task to wait on); False: call adjust()."""
        ...

    async def close(self) -> None: ...


class LocalStore:
    """Buckets in this process's memory: one small entry per tenant and limit."""

    backend = "local"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, Bucket] = {}

    async def take(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Verdict:
        verdict = take([self._buckets.get(k) for k in keys], limits, costs, self._clock())
        # Also when refused: the refill up to now is kept (it changes no level a later call
        # would compute differently, and keeps the state's time current).
        self._buckets.update(zip(keys, verdict.buckets, strict=True))
        return verdict

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        self.adjust_now(key, limit, delta)

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        self._buckets[key] = adjust(self._buckets.get(key), limit, delta, self._clock())
        return True

    async def close(self) -> None:
        self._buckets.clear()
