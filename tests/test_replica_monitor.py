"""The probe rounds: one pool's trouble must not stop the rounds' work on the others."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from gateway.fleet.monitor import ProbeSettings, ReplicaMonitor
from gateway.fleet.pools import Fleet
from router_policies.schema import parse_policy

PROBES = ProbeSettings(
    health_interval_s=1, health_timeout_s=1, unhealthy_after=1, healthy_after=1,
    scrape_interval_s=1,
)  # fmt: skip


def two_pools() -> Fleet:
    pools = {
        name: {"model": name, "replicas": [f"http://127.0.0.1:{port}"]}
        for name, port in (("first", 9201), ("second", 9202))
    }
    return Fleet(parse_policy({"pools": pools}))


async def test_one_pool_failing_its_autoscale_update_leaves_the_others_updated_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = two_pools()
    first, second = fleet.pools["first"], fleet.pools["second"]

    def broken(now: float) -> None:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(first, "update_desired", broken)
    for pool in (first, second):
        for replica in pool.replicas.values():
            replica.healthy = False  # nothing to scrape: the round only updates the signals
        for _ in range(40):
            pool.queue.join(0)  # requests waiting in the gateway: the signal asks for more
    async with aiohttp.ClientSession() as session:
        monitor = ReplicaMonitor(lambda: fleet, session, PROBES)
        with caplog.at_level(logging.ERROR, logger="gateway.fleet.monitor"):
            await monitor.scrape_once()
            await monitor.scrape_once()

    assert second.autoscale.desired > 1
    assert [r.getMessage() for r in caplog.records] == ["autoscaling update of pool first failed"]
