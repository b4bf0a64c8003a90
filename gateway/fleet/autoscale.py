"""A pool's autoscaling signal (`gateway_pool_desired_replicas`) and what it is computed from:
demand (arrivals), capacity (measured at saturation, else estimated from the learned rates)
and the scale-down stabilisation window; the formula is router_policies/autoscale.py's.

One object per pool, carried over a policy reload with its meters (a changed window trims
them), so a reload neither forgets a recent peak nor restarts a measurement.
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
        capacity_window = settings.capacity_window_s
        if old is None:
            self.stabilizer = ScaleDownStabilizer(settings.scale_down_stabilization_s)
            self.arrival_meter = RateMeter(settings.rate_window_s)
            self.capacity = CapacityMeter(capacity_window)
        else:
            # A changed window keeps what was measured: a fresh history or meter would read
            # no peak and no arrivals, and the signal would fall at the next round.
            self.stabilizer = old.stabilizer
            self.stabilizer.retime(settings.scale_down_stabilization_s)
            self.arrival_meter = old.arrival_meter
            self.arrival_meter.retime(settings.rate_window_s)
            self.capacity = old.capacity
            self.capacity.retime(capacity_window)
        self.raw_desired: int | None = old.raw_desired if old is not None else None
        self.desired: int | None = old.desired if old is not None else None
        """None (the series absent, the HPA keeping its count) until the first scrape round."""
        self._hold: tuple[float, int] | None = old._hold if old is not None else None
        """(until, replicas): a gateway just started has no history, so for one stabilisation
        window it holds the pool at the size it found, as the HPA itself would; None: over."""
        self.arrival_rate: float = old.arrival_rate if old is not None else 0.0
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
        serving: int,
        depth: float,
        mean_kv_usage: float,
        arrivals: int,
        completions: int,
    ) -> None:
        """One scrape round: ``serving`` of the ``healthy`` replicas not ejected, ``depth``
        requests waiting in the pool (gateway and engines), ``arrivals`` and ``completions``
        counted so far (every instance's)."""
        if self.desired is None and self._hold is None:  # a gateway just started
            self._hold = (now + self.settings.scale_down_stabilization_s, len(healthy))
        self.arrival_rate = self.arrival_meter.rate(now, arrivals)
        blind = self.capacity.value is None and self.capacity_estimate.value is None
        configured = self.settings.target_rate_per_replica is not None
        # Per replica serving: an ejected one completes next to nothing, and counted it would
        # read the others' capacity low.
        self.capacity.update(now, completions, serving, depth)
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
        if self._hold is not None:
            until, found = self._hold
            if now < until:
                held = max(held, found)
            else:
                self._hold = None
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
