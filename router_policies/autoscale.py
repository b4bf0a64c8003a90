"""The autoscaling signal: how many replicas a pool should have, from what the gateway sees.

Replicas needed by load and by KV pressure, whichever is higher:
  load, with a target rate per replica (target_rate_per_replica, or else a replica's
  capacity x target_utilization: measured at saturation, else estimated from the learned
  rates, router_policies/capacity.py):
         (arrival rate + queue_depth / backlog_drain_s) / target rate
         proportional to the load, so its fixed point is the right count;
  load, before any capacity is known (no replica has learned its rates yet):
         queue_depth / target_queue_per_replica
         sees backlog only, so it keeps growing while new replicas cold-start and falls to
         the minimum once the queue drains (docs/scaling.md measures both);
  KV:    healthy x mean KV-cache usage / kv_usage_ceiling
raw = clamp(ceil(max(load, KV)), min_replicas, max_replicas)
With no healthy replica (an outage) the load term still counts the demand (arrivals go on
being counted) and raw is at least 1 while there is any (with none, min_replicas 0 lets a pool
scaled to zero stay there); a term that is not a number >= 0 counts as 0.
desired = raw when it rises; when it falls, the highest raw value of the last
scale_down_stabilization_s (the Kubernetes HPA's own scale-down rule), so a brief lull does not
shed replicas that a cold start would take minutes to bring back.
An HPA reading it as an external metric with target averageValue 1 lands on exactly this count.
"""

from __future__ import annotations

import math
from collections import deque

from router_policies.schema import AutoscaleSettings


def target_rate(settings: AutoscaleSettings, capacity: float | None) -> float | None:
    """Requests/s per replica to scale at: the configured target, else the learned capacity
    x target_utilization, else None (not known yet)."""
    if settings.target_rate_per_replica is not None:
        return settings.target_rate_per_replica
    return None if capacity is None else capacity * settings.target_utilization


def desired_replicas(
    healthy: int,
    queue_depth: float,
    mean_kv_usage: float,
    settings: AutoscaleSettings,
    arrival_rate: float = 0.0,
    capacity: float | None = None,
) -> int:
    per_replica = target_rate(settings, capacity)
    if per_replica is not None:
        demand = arrival_rate + queue_depth / settings.backlog_drain_s
        by_load = demand / per_replica
    else:
        by_load = queue_depth / settings.target_queue_per_replica
    # With no healthy replica the KV term has nothing to read, but the load term still
    # measures the demand: an outage must not talk the HPA down to one replica.
    by_kv = healthy * mean_kv_usage / settings.kv_usage_ceiling if healthy > 0 else 0.0
    # Capped before rounding: a tiny divisor above (a target rate, a drain time) can make
    # the quotient inf, which no int can hold; the cap is the answer's own. A term that is
    # NaN or negative (a broken figure) asks for nothing rather than raising.
    wanted = math.ceil(min(max(_term(by_load), _term(by_kv)), settings.max_replicas) - 1e-9)
    # Nothing serves a demand: at least one replica, so the pool can come back. No demand (a
    # pool scaled to zero, idle): min_replicas, or the signal would wake it up again at once.
    asked = arrival_rate > 0 or queue_depth > 0
    floor = max(settings.min_replicas, 1) if healthy == 0 and asked else settings.min_replicas
    return min(max(wanted, floor), settings.max_replicas)


def _term(replicas: float) -> float:
    return replicas if replicas >= 0 else 0.0  # NaN compares false: 0 too


class RateMeter:
    """Events per second over a trailing window, from a monotonic count (like PromQL rate())."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def retime(self, window_s: float) -> None:
        """A reload's new window: the samples kept, the next reading trims them to it."""
        self.window_s = window_s

    def rate(self, now: float, count: int) -> float:
        samples = self._samples
        samples.append((now, count))
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        first_t, first_count = samples[0]
        elapsed = now - first_t
        return (count - first_count) / elapsed if elapsed > 0 else 0.0


class CapacityMeter:
    """A replica's capacity in requests/s, learned from the pool's completions: their rate
    per replica serving, sampled only once the pool has stayed saturated (a request waiting
    per replica serving) with the same number serving for a whole window, when replicas
    complete as fast as they can."""

    def __init__(self, window_s: float, weight: float = 0.3) -> None:
        self.window_s = window_s
        self._weight = weight
        self._completions = RateMeter(window_s)
        self._saturated_since: float | None = None
        self._healthy = 0
        self.value: float | None = None

    def retime(self, window_s: float) -> None:
        """A reload's new window: the capacity measured is kept; a saturation must last the
        new window before it is sampled again."""
        if window_s != self.window_s:
            self.window_s = window_s
            self._completions.retime(window_s)
            self._saturated_since = None

    def update(self, now: float, completions: int, healthy: int, queue_depth: float) -> None:
        rate = self._completions.rate(now, completions)
        if healthy <= 0 or queue_depth < healthy or healthy != self._healthy:
            self._saturated_since = None
            self._healthy = healthy
            return
        if self._saturated_since is None:
            self._saturated_since = now
        if now - self._saturated_since < self.window_s or rate <= 0:
            return
        sample = rate / healthy
        self.value = (
            sample if self.value is None else self.value + self._weight * (sample - self.value)
        )


class ScaleDownStabilizer:
    """Rises at once, falls only to the highest recommendation of the trailing window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._history: deque[tuple[float, int]] = deque()

    def retime(self, window_s: float) -> None:
        """A reload's new window: the history kept, the next recommendation trims it to it (a
        new history would let the signal fall at once, whichever way the window moved)."""
        self.window_s = window_s

    def forget(self) -> None:
        """Drop the history: recommendations made on a basis since replaced (the queue term,
        before any capacity was known) should not hold the signal up."""
        self._history.clear()

    def recommend(self, now: float, raw: int) -> int:
        self._history.append((now, raw))
        while self._history and self._history[0][0] < now - self.window_s:
            self._history.popleft()
        return max(value for _, value in self._history)
