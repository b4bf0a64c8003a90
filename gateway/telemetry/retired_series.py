"""Dropping the labelled series of pools and replicas a policy reload removed.

The fleet's gauges are read from live state, so a removed pool's vanish by themselves; the
per-request counters and histograms (gateway_requests_total, gateway_replica_ejections_total...)
keep a child per label set for the life of the process. Left there, a removed pool or replica
would be exported forever, and a dashboard would keep counting a pool that is gone.

A removed pool's or replica's children go at the second scrape that finds it idle (nothing
waiting, nothing in flight): the requests it still served after the reload are counted, and
their final counts exported once, before the series disappear. One no scrape saw in the policy
(added and removed between two scrapes, or removed before the first) is found by its series'
labels, and goes as if idle. One that a later reload brings
back before then keeps its series; one brought back after starts its counters from 0, which
Prometheus's rate() reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from gateway.fleet.pools import Fleet, PoolState, ReplicaState

LabelledSeries = tuple[MetricWrapperBase, tuple[str, ...]]
"""A labelled metric and its label names (prometheus_client keeps them private)."""


@dataclass(slots=True)
class _Retired:
    labels: dict[str, str]
    """The label values that name it: {"pool": ...} or {"pool": ..., "replica": ...}."""
    busy: Callable[[], bool]
    idle_seen: bool = False


class RetiredSeries(Collector):
    """Yields nothing: registered before the metrics it prunes, so that a scrape exports them
    already pruned (a registry collects in registration order)."""

    def __init__(
        self,
        current: Callable[[], Fleet],
        series: Callable[[], list[LabelledSeries]],
        forget_pool: Callable[[str], None],
        unpooled: str,
    ) -> None:
        """``series``: the labelled metrics to prune (read at scrape time: they are made after
        this collector); ``forget_pool``: drops what the caller cached of a pool's children;
        ``unpooled``: the pool label of requests no pool answered, never pruned."""
        self._current = current
        self._series = series
        self._forget_pool = forget_pool
        self._unpooled = unpooled
        self._seen: Fleet | None = None
        self._retired: dict[tuple[str, ...], _Retired] = {}

    def collect(self) -> Iterator[Metric]:
        fleet = self._current()
        if self._seen is not None and fleet is not self._seen:
            self._retire(self._seen, fleet)
        self._seen = fleet
        self._sweep(fleet)
        for key, retired in list(self._retired.items()):
            if retired.busy():
                retired.idle_seen = False
            elif retired.idle_seen:
                self._remove(retired.labels)
                del self._retired[key]
            else:
                retired.idle_seen = True
        yield from ()

    def _retire(self, old: Fleet, new: Fleet) -> None:
        for name, pool in old.pools.items():
            live = new.pools.get(name)
            if live is None:
                self._retired[(name,)] = _Retired({"pool": name}, _pool_busy(pool))
            for replica in pool.replicas.values():
                if live is None or replica.name not in live.replicas:
                    labels = {"pool": name, "replica": replica.name}
                    self._retired[(name, replica.name)] = _Retired(labels, _replica_busy(replica))
        for name, pool in new.pools.items():  # back before its series went: they stay
            self._retired.pop((name,), None)
            for address in pool.replicas:
                self._retired.pop((name, address), None)

    def _sweep(self, fleet: Fleet) -> None:
        """Series naming a pool or replica the policy no longer has, whichever generation had
        it: one no scrape saw in the policy has no state left to ask, so it counts as idle."""
        for metric, _ in self._series():
            for family in metric.collect():
                for sample in family.samples:
                    pool = sample.labels.get("pool", self._unpooled)
                    if pool == self._unpooled:
                        continue
                    live, replica = fleet.pools.get(pool), sample.labels.get("replica")
                    if live is None:
                        self._retired.setdefault((pool,), _Retired({"pool": pool}, _idle))
                    elif replica is not None and replica not in live.replicas:
                        labels = {"pool": pool, "replica": replica}
                        self._retired.setdefault((pool, replica), _Retired(labels, _idle))

    def _remove(self, labels: dict[str, str]) -> None:
        if len(labels) == 1:
            self._forget_pool(labels["pool"])
        for metric, names in self._series():
            if not set(labels) <= set(names):
                continue
            children = {
                tuple(sample.labels[n] for n in names)
                for family in metric.collect()
                for sample in family.samples
                if all(sample.labels.get(k) == v for k, v in labels.items())
            }
            for values in children:
                metric.remove(*values)


def _pool_busy(pool: PoolState) -> Callable[[], bool]:
    return lambda: pool.gateway_waiting > 0 or any(r.inflight for r in pool.replicas.values())


def _replica_busy(replica: ReplicaState) -> Callable[[], bool]:
    return lambda: replica.inflight > 0


def _idle() -> bool:
    return False
