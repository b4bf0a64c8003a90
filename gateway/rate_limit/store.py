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

_Smallest = tuple[float, float]
"""The smallest size per minute asked of a bucket, and when the bucket is full at its rate."""


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
        self._smallest: dict[str, _Smallest] = {}

    async def take(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Verdict:
        now = self._clock()
        current = [self._refilled(k, lim, now) for k, lim in zip(keys, limits, strict=True)]
        verdict = take(current, limits, costs, now)
        # Also when refused: the refill up to now is kept (it changes no level a later call
        # would compute differently, and keeps the state's time current).
        for key, limit, bucket in zip(keys, limits, verdict.buckets, strict=True):
            self._keep(key, limit, bucket)
        return verdict

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        self.adjust_now(key, limit, delta)

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        now = self._clock()
        self._keep(key, limit, adjust(self._refilled(key, limit, now), limit, delta, now))
        return True

    async def close(self) -> None:
        self._buckets.clear()
        self._smallest.clear()

    def _refilled(self, key: str, limit: Limit, now: float) -> Bucket | None:
        """The bucket at ``now``, refilled at _rate_of's rate (take and adjust then refill
        nothing more: the time is now) and capped at the caller's bound of debt."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        rate = _rate_of(self._smallest.get(key), limit, now)
        owed = max(bucket.used - max(now - bucket.at, 0.0) * rate.per_s, 0.0)
        return Bucket(min(owed, 2 * limit.per_minute), max(now, bucket.at))

    def _keep(self, key: str, limit: Limit, bucket: Bucket) -> None:
        self._buckets[key] = bucket
        if _rate_of(self._smallest.get(key), limit, bucket.at) == limit:
            self._smallest[key] = (limit.per_minute, bucket.at + bucket.used / limit.per_s)


def _rate_of(smallest: _Smallest | None, limit: Limit, now: float) -> Limit:
    """The rate a bucket refills at: the smallest size asked of it until the bucket is full at
    that size's rate, else the caller's. A caller with a larger size (an instance that has not
    reloaded a lowered limit yet, or a request admitted before the reload and settled after
    it) would otherwise refill the lowered limit's debt at the old rate. Once the bucket is
    full at the smaller rate nothing of that debt is left, and a raised limit applies."""
    if smallest is not None and smallest[0] < limit.per_minute and now < smallest[1]:
        return Limit(smallest[0])
    return limit
