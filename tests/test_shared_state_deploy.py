"""The deployment files run several gateways as one: the chart gives its gateway pods a Redis
whenever there is more than one, and the compose profile runs two instances on one Redis."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.deploy import COMPOSE, RELEASE, VARIANTS, Render, by_kind, container_of, one, pod_env

GATEWAY = f"{RELEASE}-llm-gateway"
REDIS = f"{RELEASE}-llm-gateway-redis"


def redis_url(docs: list[dict[str, Any]], deployment: str = GATEWAY) -> str | None:
    """GATEWAY_REDIS_URL as the pod sees it (a Secret's value, the password expanded)."""
    return pod_env(docs, container_of(docs, deployment)).get("GATEWAY_REDIS_URL")


def test_several_gateway_pods_share_state_through_the_charts_redis(render_chart: Render) -> None:
    docs = render_chart()  # gateway.replicas: 2 by default
    assert REDIS in by_kind(docs, "Deployment")
    url = urlsplit(redis_url(docs) or "")
    assert (url.hostname, url.port, url.path) == (REDIS, 6379, "/0")
    assert url.password and len(url.password) == 32  # the chart's own Redis needs it
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


def test_an_external_redis_url_reaches_the_pods_from_a_secret_only(render_chart: Render) -> None:
    """redis.url may hold a password: it is in a Secret, never in a Deployment's env or any
    other object as plain text, and the gateway and the picker both read it from there."""
    url = "redis://:s3cret@cache.example:6379/2"
    docs = render_chart(*VARIANTS["external-redis"])
    assert url in VARIANTS["external-redis"][0]
    for deployment in (GATEWAY, f"{GATEWAY}-picker"):
        assert redis_url(docs, deployment) == url
        container = container_of(docs, deployment)
        (entry,) = [e for e in container["env"] if e["name"] == "GATEWAY_REDIS_URL"]
        assert entry["valueFrom"]["secretKeyRef"] == {
            "name": f"{GATEWAY}-redis-url",
            "key": "redis-url",
        }
    plain = [d for d in docs if d["kind"] != "Secret"]
    assert "s3cret" not in yaml.safe_dump_all(plain)
    assert REDIS not in by_kind(docs, "Deployment")

    def checksum(*sets: str) -> str:
        pod = one(render_chart(*sets), "Deployment", GATEWAY)["spec"]["template"]
        value: str = pod["metadata"]["annotations"]["checksum/redis-url"]
        return value

    # A pod reads its env from the Secret only when it starts: a new URL must roll the pods,
    # as it did while the URL was a plain value of the pod spec.
    assert checksum("redis.url=redis://:a@cache:6379/0") != checksum(
        "redis.url=redis://:b@cache:6379/0"
    )


def test_an_existing_secret_names_the_external_redis(render_chart: Render) -> None:
    docs = render_chart(
        "redis.existingUrlSecret=my-redis",
        "redis.existingUrlSecretKey=url",
        "redis.url=redis://ignored:6379/0",
    )
    (entry,) = [e for e in container_of(docs, GATEWAY)["env"] if e["name"] == "GATEWAY_REDIS_URL"]
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "url"}
    assert not by_kind(docs, "Secret")  # the Secret is the operator's; the chart makes none
    assert REDIS not in by_kind(docs, "Deployment")
    assert (
        "checksum/redis-url"
        not in one(docs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["annotations"]
    )


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
