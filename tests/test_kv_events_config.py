"""Where KV events are configured: the routing policy's prefix source and event endpoints (an
events-only pool needs an endpoint for every replica, events are read by default where
published and never under the estimate, endpoints of replicas outside the pool are refused, an
address must be one to connect to, and one ZeroMQ refuses all the same is logged once and loses
nothing), and the simulated replica's ``--kv-events-config``, which publishes nothing unless
asked."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.fleet.kv_events import KvEventSubscriptions
from gateway.fleet.pools import Fleet
from replica.sim.kv_events import KvEventsConfig
from router_policies.schema import parse_policy
from tests.conftest import pool_policy


class TestPolicy:
    def test_events_only_needs_an_endpoint_for_every_replica(self) -> None:
        urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        with pytest.raises(ValidationError, match="no KV-event endpoint"):
            parse_policy(pool_policy(urls, prefix={"source": "events"}))
        policy = parse_policy(pool_policy(urls, prefix={"source": "events", "events": {"port": 5557}}))  # fmt: skip
        where = policy.pools["small"].events_endpoint(urls[1])
        assert where is not None and where.endpoint == "tcp://10.0.0.2:5557"

    def test_by_default_events_are_read_where_published_and_estimate_reads_none(self) -> None:
        urls = ["http://10.0.0.1:8000"]
        assert parse_policy(pool_policy(urls)).pools["small"].events_endpoint(urls[0]) is None
        policy = parse_policy(pool_policy(urls, prefix={"events": {"port": 5557}}))
        assert policy.pools["small"].events_endpoint(urls[0]) is not None
        policy = parse_policy(pool_policy(urls, prefix={"source": "estimate", "events": {"port": 5557}}))  # fmt: skip
        assert policy.pools["small"].events_endpoint(urls[0]) is None

    def test_endpoints_for_replicas_not_in_the_pool_are_refused(self) -> None:
        endpoints = {"http://10.9.9.9:8000": {"endpoint": "tcp://10.9.9.9:5557"}}
        with pytest.raises(ValidationError, match="not in the pool"):
            parse_policy(pool_policy(["http://10.0.0.1:8000"], prefix={"events": {"endpoints": endpoints}}))  # fmt: skip

    @pytest.mark.parametrize(
        "address", ["tcp://10.0.0.1", "tcp://*:5557", "tcp://10.0.0.1:events", "tcp://:5557", "ipc://"]
    )  # fmt: skip
    def test_an_event_address_must_be_one_to_connect_to(self, address: str) -> None:
        url, good = "http://10.0.0.1:8000", "tcp://10.0.0.1:5557"
        for where in ({"endpoint": address}, {"endpoint": good, "replay": address}):
            with pytest.raises(ValidationError, match="not an address to subscribe at"):
                parse_policy(pool_policy([url], prefix={"events": {"endpoints": {url: where}}}))


async def test_an_address_zeromq_refuses_is_logged_once_and_counts_no_lost_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, address = "http://10.0.0.1:8000", f"ipc://{tmp_path / ('x' * 120)}"  # a path too long
    endpoints = {url: {"endpoint": address}}
    fleet = Fleet(parse_policy(pool_policy([url], prefix={"events": {"endpoints": endpoints}})))
    subscriptions = KvEventSubscriptions(lambda: fleet)
    with caplog.at_level(logging.WARNING, logger="gateway.fleet"):
        for _ in range(3):  # the subscriptions' rounds, a second apart when running
            subscriptions.reconcile()
            await asyncio.sleep(0.05)
        await subscriptions.stop()
    (replica,) = fleet.pools["small"].replicas.values()
    assert replica.kv_events is not None and replica.kv_events.gaps == 0
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"KV events of replica {replica.name}: cannot subscribe at {address}"
    ]


def test_the_sim_publishes_nothing_unless_asked() -> None:
    assert KvEventsConfig.parse("") is None
    assert KvEventsConfig.parse('{"enable_kv_cache_events": false}') is None
    with pytest.raises(ValueError, match="unknown publisher"):
        KvEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "kafka"}')
