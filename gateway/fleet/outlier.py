"""Passive health: replicas that keep failing real requests are ejected from routing for a while.

Active health checks (gateway/fleet/monitor.py) see a replica that is down; they miss one that
answers /health but fails every request, or hangs on prefill. Like Envoy's outlier detection,
the forwarder reports each attempt's outcome here: after `consecutive_failures` failures in a
row (5xx answers, refused connections, first-token timeouts, answers that are not vLLM's, streams
cut short) the replica is ejected for a
backoff that doubles with each ejection not separated by a success, and at most
`max_ejected_share` of a pool is ejected at once. An ejected replica comes back by itself when
its time is up; it is not probed meanwhile (its /health may well be fine).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter

if TYPE_CHECKING:
    from gateway.fleet.pools import PoolState
    from gateway.fleet.replicas import ReplicaState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutlierSettings:
    consecutive_failures: int
    base_ejection_s: float
    max_ejection_s: float
    max_ejected_share: float


class OutlierDetector:
    def __init__(self, settings: OutlierSettings, ejections: Counter) -> None:
        self._settings = settings
        self._ejections = ejections

    @staticmethod
    def success(replica: ReplicaState) -> None:
        outlier = replica.outlier
        outlier.consecutive_failures = 0
        outlier.ejections = 0

    def failure(self, pool: PoolState, replica: ReplicaState, reason: str, now: float) -> bool:
        """Count one failed attempt; True when it ejected the replica."""
        outlier = replica.outlier
        outlier.consecutive_failures += 1
        settings = self._settings
        if outlier.ejected(now) or outlier.consecutive_failures < settings.consecutive_failures:
            return False
        ejected = sum(1 for r in pool.replicas.values() if r.outlier.ejected(now))
        allowed = math.floor(settings.max_ejected_share * len(pool.replicas))
        failures = outlier.consecutive_failures
        if ejected >= allowed:
            times, off = divmod(failures, settings.consecutive_failures)
            if off or times & (times - 1):
                return False  # said at 1, 2, 4, 8... times the threshold: not once a request
            log.warning(
                "replica %s of pool %s failed %d times in a row (%s) but stays in rotation: "
                "%d of %d replicas are ejected already, the most allowed",
                replica.name, pool.name, failures, reason, ejected, len(pool.replicas),
            )  # fmt: skip
            return False
        duration = min(settings.base_ejection_s * 2.0**outlier.ejections, settings.max_ejection_s)
        if duration < settings.max_ejection_s:  # counted on at the cap, 2**n would overflow
            outlier.ejections += 1
        outlier.ejected_until = now + duration
        outlier.consecutive_failures = 0
        self._ejections.labels(pool.name, replica.name).inc()
        log.warning(
            "replica %s of pool %s ejected for %.1f s after %d consecutive failures (last: %s)",
            replica.name, pool.name, duration, failures, reason,
        )  # fmt: skip
        return True
