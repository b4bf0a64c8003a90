"""Where KV events are configured: the routing policy's prefix source and event endpoints (an
events-only pool needs an endpoint for every replica, events are read by default where
published and never under the estimate, endpoints of replicas outside the pool are refused),
and the simulated replica's ``--kv-events-config``, which publishes nothing unless asked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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


def test_the_sim_publishes_nothing_unless_asked() -> None:
    assert KvEventsConfig.parse("") is None
    assert KvEventsConfig.parse('{"enable_kv_cache_events": false}') is None
    with pytest.raises(ValueError, match="unknown publisher"):
        KvEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "kafka"}')
