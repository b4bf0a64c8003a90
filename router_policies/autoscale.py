"""The autoscaling signal: how many replicas a pool should have, from what the gateway sees.

Replicas needed by load and by KV pressure, whichever is higher:
  load, with target_rate_per_replica set (recommended):
         (arrival rate + queue_depth / backlog_drain_s) / target_rate_per_replica
         proportional to the load, so its fixed point is the right count;
  load, without it: queue_depth / target_queue_per_replica
         sees backlog only, so it keeps growing while new replicas cold-start and falls to
         the minimum once the queue drains (docs/scaling.md measures both);
  KV:    healthy x mean KV-cache usage / kv_usage_ceiling
raw = clamp(ceil(max(load, KV)), min_replicas, max_replicas)
desired = raw when it rises; when it falls, the highest raw value of the last
scale_down_stabilization_s (the Kubernetes HPA's own scale-down rule), so a brief lull does not
shed replicas that a cold start would take minutes to bring back.
An HPA reading it as an external metric with target averageValue 1 lands on exactly this count.
"""

from __future__ import annotations

import math
from collections import deque

from router_policies.schema import AutoscaleSettings


def desired_replicas(
    healthy: int,
    queue_depth: float,
    mean_kv_usage: float,
    settings: AutoscaleSettings,
    arrival_rate: float = 0.0,
) -> int:
    if healthy <= 0:
        # Nothing serves: ask for at least one replica so the pool can come back.
        return max(settings.min_replicas, 1)
    if settings.target_rate_per_replica is not None:
        demand = arrival_rate + queue_depth / settings.backlog_drain_s
        by_load = demand / settings.target_rate_per_replica
    else:
        by_load = queue_depth / settings.target_queue_per_replica
    by_kv = healthy * mean_kv_usage / settings.kv_usage_ceiling
    wanted = math.ceil(max(by_load, by_kv) - 1e-9)
    return min(max(wanted, settings.min_replicas), settings.max_replicas)


class RateMeter:
    """Events per second over a trailing window, from a monotonic count (like PromQL rate())."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def rate(self, now: float, count: int) -> float:
        samples = self._samples
        samples.append((now, count))
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        first_t, first_count = samples[0]
        elapsed = now - first_t
        return (count - first_count) / elapsed if elapsed > 0 else 0.0


class ScaleDownStabilizer:
    """Rises at once, falls only to the highest recommendation of the trailing window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._history: deque[tuple[float, int]] = deque()

    def recommend(self, now: float, raw: int) -> int:
        self._history.append((now, raw))
        while self._history and self._history[0][0] < now - self.window_s:
            self._history.popleft()
        return max(value for _, value in self._history)
