"""The autoscaling signal: how many replicas a pool should have, from what the gateway sees.

HPA-style proportional scaling on two utilisations, whichever is higher:
  queue: queue_depth / (target_queue_per_replica x healthy replicas)
  KV:    mean KV-cache usage / kv_usage_ceiling
desired = clamp(ceil(healthy x max(queue, KV)), min_replicas, max_replicas).
An HPA reading it as an external metric with target averageValue 1 lands on exactly this count.
Scale-down stabilisation belongs to the HPA's behavior section, which already implements it.
"""

from __future__ import annotations

import math

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
