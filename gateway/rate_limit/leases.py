"""Shared buckets taken in leases: a busy tenant costs one Redis call per lease, not per request.

When Redis admits a request it also lends this instance up to ``lease_s`` seconds of the
bucket's refill (GATEWAY_RATE_LIMIT_LEASE_S); the requests after it are taken from that lease
in this process while it covers them and has not expired. What is leased counts as used in
Redis, so the instances together never admit more than the limit. The price: an instance may
hold, unspent, up to about ``lease_s`` of a tenant's rate that the others cannot use, until it
returns the rest with its next call to Redis, or until the bucket has refilled that much, or
until it stops (close() gives every lease back). A request no lease could cover (its cost
above a lease's size: any request, for a limit under 120 per minute at 0.5 s) is taken from
Redis at once, as exactly as without leases, beside the others rather than in line. Refunds
(the usage correction) go back into the live lease while it holds no more than one lease's
worth; the rest, a refund reaching an expired lease, or one that arrives while the lease is
being renewed, is written to Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.rate_limit.redis_store import RedisStore
from router_policies.rate_limit import SECONDS_PER_MINUTE, Bucket, BucketView, Limit, Verdict


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
            # Not on the path above: a lease never holds more than its size.
            sizes = [math.floor(limit.per_s * self._lease_s) for limit in limits]
            if any(cost > size for cost, size in zip(costs, sizes, strict=True)):
                # No lease would cover it: to Redis at once (the unspent leases given back),
                # not in line behind a renewal, nor holding the requests behind it in line.
                return await self._renew(keys, limits, costs, leases, now, [0] * len(keys))
            # Requests that arrive while one renews a lease wait for it rather than each
            # lease one of their own (what they leased would be lost to the last one's).
            renewing = next((self._renewing[k] for k in keys if k in self._renewing), None)
            if renewing is None:
                break
            await renewing.wait()
        done = asyncio.Event()
        self._renewing.update(dict.fromkeys(keys, done))
        try:
            return await self._renew(keys, limits, costs, leases, now, sizes)
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
        sizes: Sequence[int],
    ) -> Verdict | None:
        # What is left of the old leases goes back in the same call, before Redis decides: the
        # decision is then the local store's on the bucket this instance reports (a cost
        # above the size is admitted from a bucket full with the lease counted back, and a
        # refusal's views show the bucket that is short).
        returned = [lease.left if lease is not None else 0.0 for lease in leases]
        for old in leases:
            if old is not None:
                old.left = 0.0
        taken = await self._shared.take_leasing(keys, limits, costs, sizes, returned)
        if taken is None or not taken[0].allowed:
            # Nothing was taken, nothing given back: the leases keep what they had.
            for old, left in zip(leases, returned, strict=True):
                if old is not None:
                    old.left += left
            # Redis down: served (fail open). Refused: its views count the leases already.
            return None if taken is None else taken[0]
        verdict, leased = taken
        # Refunds went to Redis while it answered (adjust_now): the new lease holds what it
        # lent, no more than one lease.
        new = [  # whole units only: a fraction of a request could never be spent, only held
            _Lease(lent, size, now + self._lease_s, seen)
            for lent, size, seen in zip(leased, sizes, verdict.views, strict=True)
        ]
        if any(sizes):  # none lent, a renewal's lease landed meanwhile would be lost
            self._leases.update(zip(keys, new, strict=True))
        return _verdict(new, limits)

    async def adjust(self, key: str, limit: Limit, delta: float) -> None:
        if self.adjust_now(key, limit, delta):
            return
        lease = self._live(key)
        if lease is not None and delta < 0 and lease.left < lease.size:
            # A refund larger than the lease has room for: the lease is filled to its size
            # (spent here, no call), the rest goes back to Redis.
            kept = lease.size - lease.left
            lease.left = lease.size
            delta += kept
        await self._shared.adjust(key, limit, delta)

    def adjust_now(self, key: str, limit: Limit, delta: float) -> bool:
        lease = self._live(key)
        # Held at most one lease: more would be the tenant's rate that no other instance can
        # use (the documented price of leasing is one lease per instance).
        if lease is None or not 0.0 <= lease.left - delta <= lease.size:
            return False
        lease.left -= delta
        return True

    def _live(self, key: str) -> _Lease | None:
        """The lease a correction may go into: unexpired (an expired one is given back on the
        next call, whenever that comes: it would hold the refund until then) and not being
        renewed (its unspent part is on its way back to Redis)."""
        lease = self._leases.get(key)
        if lease is None or lease.expires <= self._clock() or key in self._renewing:
            return None
        return lease

    async def close(self) -> None:
        """Gives back what every lease holds unspent (else the tenant's rate held in them is
        lost to every instance until the bucket refills), then closes the client. Bounded:
        each call fails open within the Redis timeout, the first failure skips the others
        (Redis is then down, retry_s), and all of them together give up after twice the
        timeout, so a Redis that is down or silent does not hold up the exit."""
        held = [(key, lease) for key, lease in self._leases.items() if lease.left > 0]
        self._leases.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2 * self._shared.timeout_s):
                for key, lease in held:
                    await self._shared.adjust(key, Limit(lease.seen.limit), -lease.left)
        await self._shared.close()


def _verdict(leases: Sequence[_Lease], limits: Sequence[Limit]) -> Verdict:
    views = tuple(lease.view() for lease in leases)
    buckets = tuple(
        Bucket(limit.per_minute - seen.remaining, 0.0)
        for limit, seen in zip(limits, views, strict=True)
    )
    return Verdict(True, buckets, views)
