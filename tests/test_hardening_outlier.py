"""Outlier detection's rules, on plain objects: when a replica is ejected, for how long, and
how much of a pool may be out at once."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.fleet.outlier import OutlierDetector, OutlierSettings
from gateway.fleet.pools import PoolState
from router_policies.schema import parse_policy


def pool(n: int) -> PoolState:
    urls = [f"http://10.0.0.{i}:8000" for i in range(n)]
    policy = parse_policy({"pools": {"p": {"model": "m", "replicas": urls}}})
    return PoolState("p", policy.pools["p"])


def detector(share: float = 0.5) -> tuple[OutlierDetector, CollectorRegistry]:
    registry = CollectorRegistry()
    counter = Counter("ejections", "", ["pool", "replica"], registry=registry)
    return OutlierDetector(OutlierSettings(3, 10.0, 35.0, share), counter), registry


def test_consecutive_failures_eject_and_a_success_in_between_resets_the_count() -> None:
    outliers, registry = detector()
    p = pool(4)
    replica = next(iter(p.replicas.values()))
    assert not outliers.failure(p, replica, "HTTP 500", 0.0)
    assert not outliers.failure(p, replica, "HTTP 500", 0.0)
    outliers.success(replica)
    assert not outliers.failure(p, replica, "HTTP 500", 0.0)
    assert not outliers.failure(p, replica, "HTTP 500", 0.0)
    assert outliers.failure(p, replica, "HTTP 500", 1.0)
    assert replica.outlier.ejected(10.9) and not replica.outlier.ejected(11.0)
    assert not replica.available(5.0)
    labels = {"pool": "p", "replica": replica.name}
    assert registry.get_sample_value("ejections_total", labels) == 1


def test_the_backoff_doubles_while_the_replica_keeps_failing_up_to_the_cap() -> None:
    outliers, _ = detector()
    p = pool(4)
    replica = next(iter(p.replicas.values()))
    now, lengths = 0.0, []
    for _ in range(4):
        for _ in range(3):
            outliers.failure(p, replica, "timeout", now)
        lengths.append(replica.outlier.ejected_until - now)
        now = replica.outlier.ejected_until
    assert lengths == [10.0, 20.0, 35.0, 35.0]
    outliers.success(replica)  # it recovered: the next ejection starts short again
    for _ in range(3):
        outliers.failure(p, replica, "timeout", now)
    assert replica.outlier.ejected_until - now == 10.0


def test_a_replica_failing_for_days_stays_ejected_for_the_longest_ejection() -> None:
    """Each ejection doubles the last up to the cap: a count of them doubled on past a thousand
    (three and a half days at the defaults) would overflow, and the replica never be ejected
    again."""
    outliers, _ = detector()
    p = pool(4)
    replica = next(iter(p.replicas.values()))
    now = 0.0
    for _ in range(1100):
        for _ in range(3):
            outliers.failure(p, replica, "timeout", now)
        now = replica.outlier.ejected_until
    for _ in range(3):
        outliers.failure(p, replica, "timeout", now)
    assert replica.outlier.ejected_until - now == 35.0


def test_at_most_the_configured_share_of_a_pool_is_ejected_at_once() -> None:
    outliers, _ = detector(share=0.5)
    p = pool(5)
    ejected = []
    for replica in p.replicas.values():
        for _ in range(3):
            if outliers.failure(p, replica, "HTTP 503", 0.0):
                ejected.append(replica.name)
    assert len(ejected) == 2  # floor(0.5 x 5)
    assert len([r for r in p.replicas.values() if r.available(1.0)]) == 3


def test_a_single_replica_pool_is_never_emptied_by_the_default_share() -> None:
    outliers, _ = detector(share=0.5)
    p = pool(1)
    [replica] = p.replicas.values()
    for _ in range(10):
        assert not outliers.failure(p, replica, "HTTP 500", 0.0)
    assert replica.available(0.0)


def test_a_replica_kept_in_rotation_is_logged_at_doubling_counts_not_once_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outliers, _ = detector(share=0.5)
    p = pool(1)
    [replica] = p.replicas.values()
    with caplog.at_level(logging.WARNING, logger="gateway.fleet.outlier"):
        for _ in range(100):
            outliers.failure(p, replica, "HTTP 500", 0.0)
    said = [r.getMessage() for r in caplog.records if "stays in rotation" in r.getMessage()]
    assert [int(m.split(" failed ")[1].split()[0]) for m in said] == [3, 6, 12, 24, 48, 96]
