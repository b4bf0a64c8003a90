"""A pool's autoscaling signal (`gateway_pool_desired_replicas`) and what it is computed from:
demand (arrivals), capacity (measured at saturation, else estimated from the learned rates)
and the scale-down stabilisation window; the formula is router_policies/autoscale.py's.

One object per pool, carried over a policy reload with each meter whose window is unchanged,
so a reload neither forgets a recent peak nor restarts a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.replicas import ReplicaState
from router_policies.autoscale import (
    CapacityMeter,
    RateMeter,
    ScaleDownStabilizer,
    desired_replicas,
)
from router_policies.capacity import (
    CapacityEstimate,
    WorkloadMeter,
    batch_size,
    full_batch_capacity,
    kv_tokens,
)
from router_policies.schema import AutoscaleSettings


class PoolAutoscale:
    def __init__(self, settings: AutoscaleSettings, previous: PoolAutoscale | None) -> None:
        self.settings = settings
        old = previous
        window = settings.scale_down_stabilization_s
        self.stabilizer: ScaleDownStabilizer = (
            old.stabilizer
            if old is not None and old.stabilizer.window_s == window
            else ScaleDownStabilizer(window)
        )
        self.raw_desired: int = old.raw_desired if old is not None else settings.min_replicas
        self.desired: int = old.desired if old is not None else self.raw_desired
        self.arrival_meter: RateMeter = (
            old.arrival_meter
            if old is not None and old.arrival_meter.window_s == settings.rate_window_s
            else RateMeter(settings.rate_window_s)
        )
        self.arrival_rate: float = old.arrival_rate if old is not None else 0.0
        capacity_window = settings.capacity_window_s
        self.capacity: CapacityMeter = (
            old.capacity
            if old is not None and old.capacity.window_s == capacity_window
            else CapacityMeter(capacity_window)
        )
        self.workload: WorkloadMeter = old.workload if old is not None else WorkloadMeter()
        """The pool's mean uncached prompt and decode time per request, for the estimate."""
        self.capacity_estimate: CapacityEstimate = (
            old.capacity_estimate if old is not None else CapacityEstimate(capacity_window)
        )
        """Capacity from the learned rates, used until the measured one exists."""
        self.capacity_in_use: float | None = None
        """Per-replica capacity the signal runs on: measured, else estimated (or None)."""

    def update(
        self,
        now: float,
        healthy: Sequence[ReplicaState],
        depth: float,
        mean_kv_usage: float,
        arrivals: int,
        completions: int,
    ) -> None:
        """One scrape round: ``depth`` requests waiting in the pool (gateway and engines),
        ``arrivals`` and ``completions`` counted so far (every instance's)."""
        self.arrival_rate = self.arrival_meter.rate(now, arrivals)
        blind = self.capacity.value is None and self.capacity_estimate.value is None
        configured = self.settings.target_rate_per_replica is not None
        self.capacity.update(now, completions, len(healthy), depth)
        # Measured at saturation wins; until then, estimated from the learned rates.
        capacity = self.capacity.value
        if capacity is None:
            # Saturated as CapacityMeter counts it: a request waiting per healthy replica (an
            # engine queues every request briefly before its next step: no sign on its own).
            saturated = bool(healthy) and depth >= len(healthy)
            capacity = self.capacity_estimate.update(
                now, self._replica_capacities(healthy), saturated=saturated
            )
        self.capacity_in_use = capacity
        if blind and capacity is not None and not configured:
            # The queue term's recommendations were made blind: they should not hold it up.
            self.stabilizer.forget()
        self.raw_desired = desired_replicas(
            len(healthy), depth, mean_kv_usage, self.settings, self.arrival_rate, capacity
        )
        # Within the bounds in force: the history may hold a recommendation made under a larger
        # max_replicas, before a reload lowered it.
        held = self.stabilizer.recommend(now, self.raw_desired)
        self.desired = min(max(held, self.settings.min_replicas), self.settings.max_replicas)

    def _replica_capacities(self, healthy: Sequence[ReplicaState]) -> list[float]:
        """Each healthy replica's estimated capacity (requests/s at a full batch), from those
        that have learned their rates (the policy's default rates are no measurement)."""
        workload = self.workload.value()
        if workload is None:
            return []
        settings = self.settings
        capacities = []
        for r in healthy:
            if not r.learner.learned:
                continue
            rates = r.learner.rates()
            batch = batch_size(
                r.slots.value,
                settings.batch_slots,
                kv_tokens(workload, rates),
                r.engine.kv_capacity_tokens,
                settings.kv_usage_ceiling,
            )
            capacities.append(full_batch_capacity(rates, batch, workload))
        return capacities
