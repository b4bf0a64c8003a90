"""What the pool and replica series say as the fleet changes: ejections, other instances'
queues, and reloads that remove pools and replicas."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from gateway.app_keys import POLICY
from gateway.fleet.pools import Fleet
from gateway.telemetry.metrics import GatewayMetrics
from router_policies.schema import parse_policy
from tests.conftest import in_process_gateway, in_process_sims, metric, pool_policy

A, B = "http://127.0.0.1:9301", "http://127.0.0.1:9302"


def fleet(pools: dict[str, list[str]], previous: Fleet | None = None) -> Fleet:
    policy = {name: {"model": f"{name}-model", "replicas": urls} for name, urls in pools.items()}
    return Fleet(parse_policy({"pools": policy}), previous=previous)


class Live:
    """The live fleet, as the policy holder swaps it on a reload."""

    def __init__(self, first: Fleet) -> None:
        self.fleet = first

    def reload(self, pools: dict[str, list[str]]) -> None:
        self.fleet = fleet(pools, previous=self.fleet)


def exposition(metrics: GatewayMetrics) -> str:
    return generate_latest(metrics.registry).decode()


async def test_a_pool_whose_replicas_are_all_ejected_is_not_ready_nor_counted_healthy() -> None:
    async with (
        in_process_sims(2) as urls,
        in_process_gateway(pool_policy(urls)) as gateway,
    ):
        async with gateway.get("/ready") as response:
            assert response.status == 200
        pool = gateway.app[POLICY].fleet.pools["small"]
        for replica in pool.replicas.values():
            replica.outlier.ejected_until = time.monotonic() + 60  # every request would fail
        async with gateway.get("/ready") as response:
            assert response.status == 503
            assert (await response.json())["healthy_replicas"] == {"small": 0}
        async with gateway.get("/metrics") as response:
            text = await response.text()

    assert metric(text, "gateway_pool_healthy_replicas", pool="small") == 0
    # The replicas themselves still pass their health checks; the ejection gauge says why.
    assert metric(text, "gateway_replica_healthy", pool="small") == 1
    assert metric(text, "gateway_replica_ejected", pool="small") == 1


def test_the_exported_queue_depth_counts_what_other_instances_hold_waiting() -> None:
    live = Live(fleet({"small": [A]}))
    pool = live.fleet.pools["small"]
    pool.counts.remote.waiting = 7  # waiting inside the other gateway instances

    text = exposition(GatewayMetrics(lambda: live.fleet))

    assert metric(text, "gateway_pool_queue_depth", pool="small") == 7
    assert metric(text, "gateway_pool_gateway_waiting", pool="small") == 0  # this instance's own


def test_a_reload_drops_the_series_of_removed_pools_and_replicas_once_they_are_idle() -> None:
    live = Live(fleet({"small": [A, B], "large": [B]}))
    metrics = GatewayMetrics(lambda: live.fleet)
    for pool in ("small", "large"):
        metrics.answered(pool, "least-loaded", 200, time.perf_counter())
        metrics.ttft_of(pool).observe(0.1)
        metrics.retries.labels(pool).inc()
    metrics.ejections.labels("small", "127.0.0.1:9302").inc()
    metrics.ejections.labels("small", "127.0.0.1:9301").inc()
    exposition(metrics)
    still_running = live.fleet.pools["large"].replicas["127.0.0.1:9302"]
    still_running.inflight = 1

    live.reload({"small": [A]})
    after_reload = exposition(metrics)
    still_running.inflight = 0
    metrics.answered("large", "least-loaded", 200, time.perf_counter())  # it finished
    idle_once = exposition(metrics)
    idle_twice = exposition(metrics)

    # The removed pool's requests, until a scrape has shown their final count.
    assert metric(after_reload, "gateway_requests_total", pool="large") == 1
    assert metric(idle_once, "gateway_requests_total", pool="large") == 2
    for name in (
        "gateway_requests_total", "gateway_ttft_seconds_count",
        "gateway_request_duration_seconds_count", "gateway_retries_total",
    ):  # fmt: skip
        assert metric(idle_twice, name, pool="large") is None
        assert metric(idle_twice, name, pool="small") == 1
    replica = "gateway_replica_ejections_total"
    assert metric(idle_twice, replica, pool="small", replica="127.0.0.1:9302") is None
    assert metric(idle_twice, replica, pool="small", replica="127.0.0.1:9301") == 1
    # Counted again once the pool is back: a new series, not a child lost to the cache.
    live.reload({"small": [A], "large": [B]})
    metrics.answered("large", "least-loaded", 200, time.perf_counter())
    assert metric(exposition(metrics), "gateway_requests_total", pool="large") == 1


def test_a_pool_or_replica_no_scrape_saw_in_the_policy_has_its_series_dropped_too() -> None:
    # Added and removed between two scrapes, or removed before the first: only their series'
    # labels are left to say they were there.
    live = Live(fleet({"small": [A], "gone": [B]}))
    metrics = GatewayMetrics(lambda: live.fleet)
    metrics.answered("gone", "least-loaded", 200, time.perf_counter())
    live.reload({"small": [A]})  # before any scrape
    exposition(metrics)
    live.reload({"small": [A], "brief": [B]})
    metrics.answered("brief", "least-loaded", 200, time.perf_counter())
    live.reload({"small": [A, B]})
    metrics.ejections.labels("small", "127.0.0.1:9302").inc()
    live.reload({"small": [A]})

    exposition(metrics)
    text = exposition(metrics)

    assert metric(text, "gateway_requests_total", pool="gone") is None
    assert metric(text, "gateway_requests_total", pool="brief") is None
    assert metric(text, "gateway_replica_ejections_total", replica="127.0.0.1:9302") is None
