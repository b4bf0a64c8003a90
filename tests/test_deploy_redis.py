"""The Helm chart's own Redis: what it holds decides whose stored responses are whose and how
much of each rate limit is left, so it answers only to the password its pods are given, and its
NetworkPolicy admits only the release's gateway and picker pods."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from replica.processes import free_port
from tests.deploy import RELEASE, Render, by_kind, container_of, expanded, one, pod_env
from tests.redis_server import require_redis

pytestmark = pytest.mark.timeout(600)  # the first test may wait for the tools' install

WITH_PICKER = ("redis.enabled=true", "picker.enabled=true")
GATEWAY, PICKER, REDIS = (f"{RELEASE}-llm-gateway{suffix}" for suffix in ("", "-picker", "-redis"))


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and `In` expressions) against a pod's labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_the_charts_redis_answers_only_to_the_password_its_pods_are_given(
    render_chart: Render,
) -> None:
    binary = require_redis()
    docs = render_chart(*WITH_PICKER)
    server_spec = container_of(docs, REDIS)
    server_env = pod_env(docs, server_spec)
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "no"]
    argv += [expanded(arg, server_env) for arg in server_spec["args"]]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The readiness probe as the kubelet runs it, in the container's environment.
        probe = server_spec["readinessProbe"]["exec"]["command"]
        cli = str(Path(binary).with_name(probe[0]))
        deadline = time.monotonic() + 10
        while (
            answer := subprocess.run(
                [cli, "-p", str(port), *probe[1:]], env=server_env, capture_output=True, text=True
            ).stdout.strip()
        ) != "PONG" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answer == "PONG"

        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        for deployment in (GATEWAY, PICKER):
            url = pod_env(docs, container_of(docs, deployment))["GATEWAY_REDIS_URL"]
            assert urlsplit(url).hostname == REDIS
            local = url.replace(f"@{REDIS}:6379", f"@127.0.0.1:{port}")
            assert redis.Redis.from_url(local).ping(), deployment
    finally:
        server.terminate()
        server.wait(10)


def test_a_password_secret_of_your_own_replaces_the_generated_one(render_chart: Render) -> None:
    docs = render_chart(*WITH_PICKER, "redis.auth.existingSecret=mine")
    assert f"{RELEASE}-llm-gateway-redis-auth" not in by_kind(docs, "Secret")
    for deployment in (GATEWAY, PICKER, REDIS):
        (password,) = (
            e for e in container_of(docs, deployment)["env"] if e["name"] == "REDIS_PASSWORD"
        )
        assert password["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "redis-password"}


def test_the_charts_redis_admits_only_the_releases_gateway_and_picker_pods(
    render_chart: Render,
) -> None:
    docs = render_chart(*WITH_PICKER)
    pods = {
        name: workload["spec"]["template"]["metadata"]["labels"]
        for kind in ("Deployment", "StatefulSet")
        for name, workload in by_kind(docs, kind).items()
    }
    assert len(pods) >= 4  # the gateway, the picker, the Redis and the vLLM pools
    policy = one(docs, "NetworkPolicy", REDIS)["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert {name for name, labels in pods.items() if selects(policy["podSelector"], labels)} == {
        REDIS
    }
    (rule,) = policy["ingress"]
    admitted = {
        name
        for name, labels in pods.items()
        if any(selects(peer["podSelector"], labels) for peer in rule["from"])
    }
    assert admitted == {GATEWAY, PICKER}
    another_release = {**pods[GATEWAY], "app.kubernetes.io/instance": "other"}
    assert not any(selects(peer["podSelector"], another_release) for peer in rule["from"])
    (port,) = rule["ports"]
    assert port["port"] in {p["name"] for p in container_of(docs, REDIS)["ports"]}

    opened = render_chart(*WITH_PICKER, "redis.networkPolicy.enabled=false")
    assert not by_kind(opened, "NetworkPolicy")
