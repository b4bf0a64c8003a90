"""The deployment files run several gateways as one: the chart gives its gateway pods a Redis
whenever there is more than one, and the compose profile runs two instances on one Redis."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy import COMPOSE, RELEASE, Render, by_kind, one

GATEWAY = f"{RELEASE}-llm-gateway"
REDIS = f"{RELEASE}-llm-gateway-redis"


def redis_url(docs: list[dict[str, Any]]) -> str | None:
    (container,) = one(docs, "Deployment", GATEWAY)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return env.get("GATEWAY_REDIS_URL")


def test_several_gateway_pods_share_state_through_the_charts_redis(render_chart: Render) -> None:
    docs = render_chart()  # gateway.replicas: 2 by default
    assert REDIS in by_kind(docs, "Deployment")
    assert redis_url(docs) == f"redis://{REDIS}:6379/0"
    assert one(docs, "Service", REDIS)["spec"]["ports"][0]["port"] == 6379


def test_one_gateway_pod_needs_no_redis(render_chart: Render) -> None:
    docs = render_chart("gateway.replicas=1")
    assert REDIS not in by_kind(docs, "Deployment")
    assert redis_url(docs) is None


def test_redis_can_be_forced_on_or_off(render_chart: Render) -> None:
    assert redis_url(render_chart("gateway.replicas=1", "redis.enabled=true")) is not None
    off = render_chart("redis.enabled=false")
    assert REDIS not in by_kind(off, "Deployment")
    assert redis_url(off) is None


def test_an_external_redis_replaces_the_charts_own(render_chart: Render) -> None:
    docs = render_chart("redis.url=redis://cache.example:6379/2")
    assert REDIS not in by_kind(docs, "Deployment")
    assert redis_url(docs) == "redis://cache.example:6379/2"


def test_compose_profile_runs_two_gateways_on_one_redis() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    shared = [
        name for name, spec in services.items()
        if spec.get("environment", {}).get("GATEWAY_REDIS_URL") == "redis://redis:6379/0"
    ]  # fmt: skip
    assert len(shared) == 2
    for name in shared:
        assert services[name]["profiles"] == ["redis"]
        assert "redis" in services[name]["depends_on"]
    assert services["redis"]["profiles"] == ["redis"]
    assert "ports" not in services["redis"]  # reachable by the gateways only
