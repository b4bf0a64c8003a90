"""Token-bucket arithmetic for per-tenant rate limits: plain values in, plain values out.

A limit of C per minute is a bucket that holds at most C and refills at C/60 per second; a
request takes its cost from every bucket of its tenant (requests: 1, tokens: the estimate)
or from none. The local store runs these functions; the Redis store runs the same rules in a
Lua script (gateway/rate_limit/redis_store.py), and one table of cases tests both.

Rules worth knowing:
- A cost above the bucket's size could never be admitted: it is admitted from a full bucket
  and leaves the bucket in debt, never past one full bucket: the next request waits at most
  about a minute, however large the one before (an estimate of n x max_tokens can be many
  buckets, and a stream without usage is never corrected).
- The token cost is an estimate; the correction the replica's usage brings may push a bucket
  into debt too, within the same bound (a bogus report cannot lock a tenant out for more than
  about a minute).
- A limit lowered by a reload keeps the bound: what was used under the old size counts
  against the new one only up to one full bucket of debt (600 per minute used, then lowered
  to 10: the next request waits about a minute, not the hour 600 would take at 10 a minute).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from router_policies.value import value

SECONDS_PER_MINUTE = 60.0


@value
class Limit:
    """A bucket's size; it refills from empty to full in one minute."""

    per_minute: float

    @property
    def per_s(self) -> float:
        return self.per_minute / SECONDS_PER_MINUTE


@value
class Bucket:
    """What a bucket has given out and not yet refilled, at a time (seconds on any clock, the
    same for every call). Kept as the amount used, not the level left, so that a limit changed
    by a policy reload applies at once: what the tenant used in the last minute counts against
    the new size."""

    used: float
    at: float


@value
class BucketView:
    """What the x-ratelimit-* headers report of one bucket after the decision."""

    limit: float
    remaining: float
    reset_s: float
    """Seconds until the bucket is full again."""


@value
class Verdict:
    allowed: bool
    buckets: tuple[Bucket, ...]
    """Every bucket's new state (nothing taken, refilled to now, when refused)."""
    views: tuple[BucketView, ...]
    retry_after_s: float = 0.0
    """When refused: seconds until every bucket holds what this request needs."""


def refilled(bucket: Bucket | None, limit: Limit, now: float) -> Bucket:
    """The bucket at ``now``; a bucket never seen (or forgotten) is full (nothing used)."""
    if bucket is None:
        return Bucket(0.0, now)
    elapsed = max(now - bucket.at, 0.0)  # a clock that steps back refills nothing
    # Capped: only a bucket used under a larger size (a limit lowered since) is ever above it.
    used = min(max(bucket.used - elapsed * limit.per_s, 0.0), _most_used(limit))
    return Bucket(used, max(now, bucket.at))


def needed(cost: float, limit: Limit) -> float:
    """What the bucket must hold to admit ``cost``: all of it, or a full bucket."""
    return min(cost, limit.per_minute)


def taken(cost: float, limit: Limit) -> float:
    """What an admitted ``cost`` takes from its bucket: all of it, up to the debt's bound (a
    cost above the bucket's size is admitted from a full bucket only). A correction by the
    usage counts from this, not from the cost: a refund of the part never taken would refill
    what the request's tokens used."""
    return min(cost, _most_used(limit))


def _most_used(limit: Limit) -> float:
    """A full bucket given out and one more owed: the debt's bound."""
    return 2 * limit.per_minute


def view(bucket: Bucket, limit: Limit) -> BucketView:
    remaining = max(limit.per_minute - bucket.used, 0.0)
    return BucketView(limit.per_minute, remaining, bucket.used / limit.per_s)


def take(
    buckets: Sequence[Bucket | None],
    limits: Sequence[Limit],
    costs: Sequence[float],
    now: float,
) -> Verdict:
    """Take ``costs[i]`` from bucket i for every i, or nothing at all."""
    current = [refilled(b, lim, now) for b, lim in zip(buckets, limits, strict=True)]
    short = [  # a cost of 0 (a stored response's lookup) is admitted from a bucket in debt
        (needed(cost, lim) - (lim.per_minute - b.used)) / lim.per_s
        for b, lim, cost in zip(current, limits, costs, strict=True)
        if cost > 0 and lim.per_minute - b.used < needed(cost, lim)
    ]
    if short:
        views = tuple(view(b, lim) for b, lim in zip(current, limits, strict=True))
        return Verdict(False, tuple(current), views, max(short))
    after = tuple(
        Bucket(min(b.used + cost, _most_used(lim)), b.at)
        for b, lim, cost in zip(current, limits, costs, strict=True)
    )
    views = tuple(view(b, lim) for b, lim in zip(after, limits, strict=True))
    return Verdict(True, after, views)


def adjust(bucket: Bucket | None, limit: Limit, delta: float, now: float) -> Bucket:
    """Take ``delta`` more (a refund when negative): the level stays within [-size, size]."""
    current = refilled(bucket, limit, now)
    used = min(max(current.used + delta, 0.0), _most_used(limit))
    return Bucket(used, current.at)


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes x-ratelimit-reset-*: "20ms", "1.5s", "6m0s" (rounded up
    to the millisecond: never earlier than the truth)."""
    ms = math.ceil(round(seconds * 1000, 6))  # round first: 1.5 s is not 1501 ms
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest_ms = divmod(ms, 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
