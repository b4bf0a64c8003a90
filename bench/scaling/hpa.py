"""The Kubernetes HorizontalPodAutoscaler (autoscaling/v2, pkg/controller/podautoscaler): its
per-sync arithmetic for an External metric with an AverageValue target."""

from __future__ import annotations

import math
from dataclasses import dataclass


def hpa_external_average_value(
    metric: float, target: float, current: int, tolerance: float = 0.1
) -> int:
    """Replicas an External metric with an AverageValue target asks for.

    As GetExternalPerPodMetricReplicas: usage ratio = metric / (target x current replicas);
    within the tolerance keep the current count, otherwise ceil(metric / target), which does
    not depend on the current count.
    """
    if current > 0 and abs(1.0 - metric / (target * current)) <= tolerance:
        return current
    return math.ceil(metric / target - 1e-9)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    """The defaults of autoscaling/v2 when ``behavior`` is left out."""

    scale_up_window_s: float = 0.0
    scale_up: tuple[ScalingPolicy, ...] = (
        ScalingPolicy("Percent", 100, 15.0),
        ScalingPolicy("Pods", 4, 15.0),
    )
    scale_down_window_s: float = 300.0
    scale_down: tuple[ScalingPolicy, ...] = (ScalingPolicy("Percent", 100, 15.0),)


class Hpa:
    """The HPA controller's per-sync arithmetic: metric -> recommendation -> stabilization ->
    rate limits -> min/max. Select policy is Max (the default) in both directions."""

    def __init__(
        self,
        target: float,
        min_replicas: int,
        max_replicas: int,
        behavior: HpaBehavior = HpaBehavior(),
        tolerance: float = 0.1,
    ) -> None:
        self.target = target
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.behavior = behavior
        self.tolerance = tolerance
        self._recommendations: list[tuple[float, int]] = []
        self._up_events: list[tuple[float, int]] = []
        self._down_events: list[tuple[float, int]] = []

    def recommend(self, metric: float, current: int) -> int:
        return hpa_external_average_value(metric, self.target, current, self.tolerance)

    def sync(self, now: float, metric: float, current: int) -> int:
        """The replica count the HPA writes to the scale subresource at this sync."""
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            desired = self._normalize(now, self.recommend(metric, current), current)
        if desired > current:
            self._up_events.append((now, desired - current))
        elif desired < current:
            self._down_events.append((now, current - desired))
        return desired

    def _normalize(self, now: float, raw: int, current: int) -> int:
        behavior = self.behavior
        up_cut = now - behavior.scale_up_window_s
        down_cut = now - behavior.scale_down_window_s
        up, down = raw, raw
        for at, value in self._recommendations:
            if at > up_cut:
                up = min(up, value)
            if at > down_cut:
                down = max(down, value)
        keep = max(behavior.scale_up_window_s, behavior.scale_down_window_s)
        self._recommendations = [(a, v) for a, v in self._recommendations if a > now - keep]
        self._recommendations.append((now, raw))
        stabilized = min(max(current, up), down)
        if stabilized > current:
            limit = max(self._limit(now, current, p, up=True) for p in behavior.scale_up)
            return min(stabilized, max(limit, current), self.max_replicas)
        if stabilized < current:
            limit = min(self._limit(now, current, p, up=False) for p in behavior.scale_down)
            return max(stabilized, min(limit, current), self.min_replicas)
        return stabilized

    def _limit(self, now: float, current: int, policy: ScalingPolicy, up: bool) -> int:
        cut = now - policy.period_s
        added = sum(n for at, n in self._up_events if at > cut)
        removed = sum(n for at, n in self._down_events if at > cut)
        start = current - added + removed
        if policy.kind == "Pods":
            return start + policy.value if up else start - policy.value
        if up:
            return math.ceil(start * (1 + policy.value / 100))
        return int(start * (1 - policy.value / 100))
