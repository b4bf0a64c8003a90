"""Shared buckets taken in leases: a busy tenant costs one Redis call per lease, not per request.

When Redis admits a request it also lends this instance up to ``lease_s`` seconds of the
bucket's refill (GATEWAY_RATE_LIMIT_LEASE_S); the requests after it are taken from that lease
in this process while it covers them and has not expired. What is leased counts as used in
Redis, so the instances together never admit more than the limit. The price: an instance may
hold, unspent, up to about ``lease_s`` of a tenant's rate that the others cannot use, until it
returns the rest with its next call to Redis, or until the bucket has refilled that much. A
limit too small to lease a whole request (under 120 per minute at 0.5 s) is taken from Redis
on every request, as exactly as without leases. Refunds (the usage correction) go back into
the lease they came from; only what the lease cannot absorb is written to Redis.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.rate_limit.redis_store import RedisStore
from router_policies.rate_limit import SECONDS_PER_MINUTE, Bucket, BucketView, Limit, Verdict

_MOST_HELD_LEASES = 4
"""Refunds may grow a lease to this many leases' worth; beyond it, the excess goes to Redis."""


@dataclass(slots=True)
class _Lease:
    left: float
    size: float
    expires: float
    seen: BucketView
    """The bucket as Redis reported it at the lease, what was leased counted as used."""

    def view(self) -> BucketView:
        """The bucket as this instance sees it: what it holds unspent is still the tenant's."""
        seen = self.seen
        held_s = self.left / (seen.limit / SECONDS_PER_MINUTE)
        return BucketView(seen.limit, seen.remaining + self.left, max(seen.reset_s - held_s, 0.0))


class LeasedStore:
    """A BucketStore over the Redis one that takes from it in leases."""

    def __init__(
        self, shared: RedisStore, lease_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.backend = shared.backend
        self._shared = shared
        self._lease_s = lease_s
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._renewing: dict[str, asyncio.Event] = {}

    async def take(
        self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]
    ) -> Verdict | None:
        while True:
            leases = [self._leases.get(k) for k in keys]
            now = self._clock()
            held = [
                lease
                for lease, cost in zip(leases, costs, strict=True)
                if lease is not None and lease.expires > now and lease.left >= cost
            ]
            if len(held) == len(keys):
                for spent, cost in zip(held, costs, strict=True):
                    spent.left -= cost
                return _verdict(held, limits)
            # Requests that arrive while one renews a lease wait for it rather than each
            # lease one of their own (what they leased would be lost to the last one's).
            renewing = next((self._renewing[k] for k in keys if k in self._renewing), None)
            if renewing is None:
                break
            await renewing.wait()
        done = asyncio.Event()
        self._renewing.update(dict.fromkeys(keys, done))
        try:
            return await self._renew(keys, limits, costs, leases, now)
        finally:
            for key in keys:
                self._renewing.pop(key, None)
            done.set()

    async def _renew(
        self,
        keys: Sequence[str],
        limits: Sequence[Limit],
        costs: Sequence[float],
        leases: Sequence[_Lease | None],
        now: float,
    ) -> Verdict | None:
        # What is left of the old leases goes back in the same call, before Redis decides: the
        # decision is then the local store's on the bucket this instance reports (a cost
        # above the size is admitted from a bucket full with the lease counted back, and a
        # refusal's views show the bucket that is short).
        returned = [lease.left if lease is not None else 0.0 for lease in leases]
        for old in leases:
            if old is not None:
                old.left = 0.0
        # Whole units only: a fraction of a request could never be spent, only held.
        sizes = [math.floor(limit.per_s * self._lease_s) for limit in limits]
        taken = await self._shared.take_leasing(keys, limits, costs, sizes, returned)
        if taken is None or not taken[0].allowed:
            # Nothing was taken, nothing given back: the leases keep what they had.
            for old, left in zip(leases, returned, strict=True):
                if old is not None:
                    old.left += left
            # Redis down: served (fail open). Refused: its views count the leases already.
            return None if taken is None else taken[0]
        verdict, leased = taken
        # Refunds that reached an old lease while Redis answered move into its successor.
        new = [
            _Lease(lent + (old.left if old else 0.0), size, now + self._lease_s, seen)
            for lent, old, size, seen in zip(leased, leases, sizes, verdict.views, strict=True)
        ]
        self._leases.update(zip(keys, new, strict=True))
        return _verdict(new, limits)

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        if self.adjust_now(key, limit, delta):
            return
        lease = self._leases.get(key)
        if lease is None or lease.left < delta:
            await self._shared.adjust(key, limit, delta)
            return
        # A refund the lease would hold beyond its bound: the lease keeps the bound.
        excess = lease.left - delta - _MOST_HELD_LEASES * lease.size
        lease.left -= delta + excess
        await self._shared.adjust(key, limit, -excess)

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        lease = self._leases.get(key)
        if lease is None or lease.left < delta:
            return False
        if lease.left - delta > _MOST_HELD_LEASES * lease.size:
            return False
        lease.left -= delta
        return True

    async def close(self) -> None:
        self._leases.clear()
        await self._shared.close()


def _verdict(leases: Sequence[_Lease], limits: Sequence[Limit]) -> Verdict:
    views = tuple(lease.view() for lease in leases)
    buckets = tuple(
        Bucket(limit.per_minute - seen.remaining, 0.0)
        for limit, seen in zip(limits, views, strict=True)
    )
    return Verdict(True, buckets, views)
