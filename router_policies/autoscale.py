"""The autoscaling signal: how many replicas a pool should have, from what the gateway sees.

HPA-style proportional scaling on two utilisations, whichever is higher:
  queue: queue_depth / (target_queue_per_replica x healthy replicas)
  KV:    mean KV-cache usage / kv_usage_ceiling
raw = clamp(ceil(healthy x max(queue, KV)), min_replicas, max_replicas)
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
    healthy: int, queue_depth: float, mean_kv_usage: float, settings: AutoscaleSettings
) -> int:
    if healthy <= 0:
        # Nothing serves: ask for at least one replica so the pool can come back.
        return max(settings.min_replicas, 1)
    queue_util = queue_depth / (settings.target_queue_per_replica * healthy)
    kv_util = mean_kv_usage / settings.kv_usage_ceiling
    wanted = math.ceil(healthy * max(queue_util, kv_util) - 1e-9)
    return min(max(wanted, settings.min_replicas), settings.max_replicas)


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
