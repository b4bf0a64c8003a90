"""The Helm chart as a whole, checked by the real tools: `helm lint` and a dry-run install are
clean, every variant of the values renders valid Kubernetes 1.30 objects (unknown fields refused)
and the objects it promises, values the chart cannot honour are refused with a message naming
them, and each schema check has a negative twin that breaks a template and proves it bites.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from tests.deploy import (
    CHART,
    CRD_KINDS,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    Render,
    Tools,
    by_kind,
    container_of,
    one,
    policy_of,
    run,
    sts_name,
)

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the tools' install

K8S_VERSION = "1.30"


def kubernetes_validate(tools: Tools, manifest: str) -> subprocess.CompletedProcess[str]:
    argv: list[str | Path] = [tools.need("kubernetes_validate"), "--strict", "-k", K8S_VERSION, "-"]
    return run(argv, stdin=manifest)


def test_helm_lint_is_clean(tools: Tools, helm_env: dict[str, str]) -> None:
    for sets in (
        (),
        ("autoscaling.mode=keda", "serviceMonitor.enabled=true", "picker.enabled=true"),
    ):
        argv: list[str | Path] = [tools.need("helm"), "lint", "--strict", CHART]
        for s in sets:
            argv += ["--set", s]
        done = run(argv, env=helm_env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "0 chart(s) failed" in done.stdout


def test_helm_install_dry_run_renders_the_notes(tools: Tools, helm_env: dict[str, str]) -> None:
    argv: list[str | Path] = [tools.need("helm"), "install", RELEASE, CHART, "-n", NAMESPACE]
    done = run([*argv, "--dry-run=client", "--set", "autoscaling.mode=hpa"], env=helm_env)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"port-forward svc/{RELEASE}-llm-gateway 8080:8080" in notes
    assert "prometheus-adapter" in notes


def test_the_notes_of_a_picker_without_gateway_pods_point_at_the_inference_pool(
    tools: Tools, helm_env: dict[str, str]
) -> None:
    argv: list[str | Path] = [tools.need("helm"), "install", RELEASE, CHART, "-n", NAMESPACE]
    sets = [a for s in VARIANTS["picker-only"] for a in ("--set", s)]
    done = run([*argv, "--dry-run=client", *sets], env=helm_env)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert f"svc/{RELEASE}-llm-gateway " not in notes, "a Service with no pods behind it"
    assert f"InferencePool, name: {RELEASE}-llm-gateway}}" in notes
    assert f"port-forward deploy/{RELEASE}-llm-gateway-picker 8081:8081" in notes


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_chart_passes_kubernetes_schemas(
    variant: str, tools: Tools, helm_template: Callable[..., str]
) -> None:
    """Every built-in kind against the Kubernetes 1.30 OpenAPI schema, unknown fields refused."""
    manifest = helm_template(*VARIANTS[variant])
    done = kubernetes_validate(tools, manifest)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(manifest) if d}
    validated = set(re.findall(r"passed for resource (\w+)/", done.stdout + done.stderr))
    assert {k.lower() for k in kinds - CRD_KINDS} <= validated
    # kubernetes-validate only warns about CRDs: those are checked with their own models below.
    for kind in kinds & CRD_KINDS:
        assert f"Couldn't find schema for kind {kind}" in done.stdout + done.stderr


def test_each_variant_renders_what_it_promises(render_chart: Render) -> None:
    default = render_chart()
    assert set(by_kind(default, "StatefulSet")) == {sts_name("small"), sts_name("large")}
    assert not by_kind(default, "HorizontalPodAutoscaler")
    assert not by_kind(default, "ScaledObject")
    assert set(by_kind(render_chart("autoscaling.mode=hpa"), "HorizontalPodAutoscaler")) == {
        sts_name("small"),
        sts_name("large"),
    }
    assert set(by_kind(render_chart("autoscaling.mode=keda"), "ScaledObject")) == {
        sts_name("small"),
        sts_name("large"),
    }
    monitored = render_chart(*VARIANTS["service-monitor"])
    assert len(by_kind(monitored, "ServiceMonitor")) == 2
    assert len(by_kind(monitored, "PrometheusRule")) == 1
    assert by_kind(render_chart("redis.enabled=true"), "Deployment").keys() == {
        f"{RELEASE}-llm-gateway",
        f"{RELEASE}-llm-gateway-redis",
    }
    one_pool = render_chart("pools.large.enabled=false")
    assert set(by_kind(one_pool, "StatefulSet")) == {sts_name("small")}
    assert set(policy_of(one_pool)["pools"]) == {"small"}
    assert "tiers" not in policy_of(one_pool)  # the `auto` tier needs both pools
    external = render_chart(*VARIANTS["external-replicas"])
    assert set(by_kind(external, "StatefulSet")) == {sts_name("small")}
    assert set(by_kind(external, "HorizontalPodAutoscaler")) == {sts_name("small")}
    assert policy_of(external)["pools"]["large"]["replicas"] == [
        "http://10.1.2.3:8000",
        "http://10.1.2.4:8000",
    ]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        # values.schema.json: misspelt keys and wrong types
        (("autoscaling.mode=sometimes",), "at '/autoscaling/mode': value must be one of"),
        (("autoscaling.mod=hpa",), "additional properties 'mod' not allowed"),
        (("pools.small.replicas=two",), "at '/pools/small/replicas': got string, want integer"),
        (("vllm.modelCache.type=hostPath",), "at '/vllm/modelCache/type'"),
        # the templates' own checks
        (("pools.small.profile=gpu-huge",), "is not a profile"),
        (("pools.Small_Pool.enabled=true", "pools.Small_Pool.profile=gpu-small"), "pool name"),
        (("pools.small.enabled=false", "pools.large.enabled=false"), "enable at least one pool"),
        (("picker.failureMode=Open",), "at '/picker/failureMode': value must be one of"),
        (
            (
                "picker.enabled=true",
                "pools.small.replicaUrls={http://10.1.2.3:8000}",
                "pools.large.replicaUrls={http://10.1.2.4:8000}",
            ),
            "every enabled pool lists replicaUrls",
        ),
        (
            ("autoscaling.mode=hpa", "pools.small.autoscaling.minReplicas=9"),
            "minReplicas is above maxReplicas",
        ),
        # what the gateway would refuse, or silently drop
        (("autoscaling.mode=none", "pools.small.replicas=0"), "pools.small.replicas: at least 1"),
        (
            ("policy.tiers.auto.large=large-pool",),
            "policy.tiers.auto.large: large-pool is not a pool",
        ),
        (("policy.pools.small.model=m",), "policy.pools: pools are the chart's `pools:` value"),
        (
            ("pools.small.policy.autoscale.max_replicas=2",),
            "pools.small.policy.autoscale.max_replicas: the chart sets it from "
            "pools.small.autoscaling.maxReplicas",
        ),
        # gateway.env naming what the chart sets itself, which would be in the env twice
        (("gateway.env.GATEWAY_WORKERS=4",), "gateway.env.GATEWAY_WORKERS: the chart sets"),
        (("gateway.env.GATEWAY_PORT=9000",), "GATEWAY_PORT itself; use gateway.port"),
        (("gateway.env.GATEWAY_SHUTDOWN_DELAY_S=0",), "use gateway.shutdownDelaySeconds"),
        (
            ("picker.enabled=true", "gateway.replicas=0", "gateway.env.GATEWAY_LOG_LEVEL=DEBUG"),
            "GATEWAY_LOG_LEVEL itself; use gateway.logLevel",
        ),
        (
            ("redis.enabled=true", "gateway.env.GATEWAY_REDIS_URL=redis://cache:6379/0"),
            "GATEWAY_REDIS_URL itself; use redis.url",
        ),
        (
            ("redis.enabled=true", "gateway.env.REDIS_PASSWORD=other"),
            "REDIS_PASSWORD itself; use redis.auth.existingSecret",
        ),
        (
            ("gateway.adminToken=t0ken", "gateway.env.GATEWAY_ADMIN_TOKEN=other"),
            "GATEWAY_ADMIN_TOKEN itself; use gateway.adminToken",
        ),
    ],
)
def test_chart_refuses_bad_values_by_name(
    sets: tuple[str, ...], message: str, helm_template: Callable[..., str]
) -> None:
    output = helm_template(*sets, check=False)
    assert message in output


@pytest.mark.parametrize(
    ("sets", "prefix"),
    [
        # An external Redis may serve other releases: their keys are kept apart by default,
        (("redis.url=redis://cache:6379/0",), f"llm-gateway:{NAMESPACE}:{RELEASE}"),
        # unless a prefix was chosen (the variable, or the policy's, which the variable would
        # otherwise override),
        (("redis.url=redis://cache:6379/0", "gateway.env.GATEWAY_STATE_KEY_PREFIX=mine"), "mine"),
        (("redis.url=redis://cache:6379/0", "policy.state.key_prefix=mine"), None),
        (("redis.enabled=true",), None),  # and the chart's own Redis is the release's alone
    ],
)
def test_an_external_redis_gets_a_key_prefix_of_the_release_unless_one_was_chosen(
    sets: tuple[str, ...], prefix: str | None, render_chart: Render
) -> None:
    deployment = by_kind(render_chart(*sets), "Deployment")[f"{RELEASE}-llm-gateway"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    given = [e.get("value") for e in container["env"] if e["name"] == "GATEWAY_STATE_KEY_PREFIX"]
    assert given == ([prefix] if prefix is not None else [])


@pytest.mark.parametrize(
    ("sets", "name", "value"),
    [
        (("picker.enabled=true",), "GATEWAY_RETRIES", "2"),
        (("redis.enabled=false",), "GATEWAY_REDIS_URL", "redis://cache:6379/0"),
        (("picker.enabled=true",), "GATEWAY_ADMIN_TOKEN", "t0ken"),
    ],
)
def test_gateway_env_reaches_every_container_once_per_name(
    sets: tuple[str, ...], name: str, value: str, render_chart: Render
) -> None:
    """What the chart does not set itself, gateway.env adds to the gateway and the picker."""
    docs = render_chart(*sets, f"gateway.env.{name}={value}")
    containers = [
        container
        for deployment_name, deployment in by_kind(docs, "Deployment").items()
        if not deployment_name.endswith("-redis")
        for container in deployment["spec"]["template"]["spec"]["containers"]
    ]
    assert len(containers) == (2 if "picker.enabled=true" in sets else 1)
    for container in containers:
        names = [entry["name"] for entry in container["env"]]
        assert len(names) == len(set(names)), (container["name"], names)
        assert {"name": name, "value": value} in container["env"], container["name"]


# --- negative: the schema checks bite -----------------------------------------------------------


BREAKAGES: dict[str, tuple[str, str, str, str]] = {
    # name: (template file, text to replace, replacement, what the validator must say)
    "wrong-type": (
        "gateway-deployment.yaml",
        "replicas: {{ .Values.gateway.replicas }}",
        'replicas: "two"',
        "spec.replicas",
    ),
    "missing-required-field": (
        "gateway-deployment.yaml",
        '  selector:\n    matchLabels:\n      {{- include "llm-gateway.gatewaySelectorLabels" . | nindent 6 }}\n',
        "",
        "'selector' is a required property",
    ),
    "unknown-field": (
        "vllm-statefulset.yaml",
        "podManagementPolicy: Parallel",
        "podManagementPolcy: Parallel",
        "'podManagementPolcy' was unexpected",
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_kubernetes_validate_rejects_a_broken_template(
    breakage: str, tools: Tools, helm_template: Callable[..., str], tmp_path: Path
) -> None:
    filename, old, new, message = BREAKAGES[breakage]
    chart = tmp_path / "llm-gateway"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / filename
    text = template.read_text()
    assert old in text
    template.write_text(text.replace(old, new))
    done = kubernetes_validate(tools, helm_template(chart=chart))
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


# --- per-key limits under several workers -------------------------------------------------------

TENANT = (
    "policy.limits.tenants.acme.api_key_sha256={" + "ab" * 32 + "}",
    "policy.limits.tenants.acme.requests_per_minute=600",
)
NODE_CPUS = 64
"""The CPUs of the node a pod without a CPU limit would see (its affinity, no cgroup quota)."""


def gateway_would_refuse(docs: list[dict[str, Any]], tmp_path: Path) -> str | None:
    """What `serve` would say at start-up in the gateway pod these objects describe (None: it
    starts): its env as Kubernetes sets it (the last entry of a name wins), `workers: auto` read
    as gateway/settings.py's usable_cpus reads a container's cgroup quota on a 64-CPU node."""
    from gateway.policy.check import load_checked_policy
    from gateway.settings import Settings
    from gateway.state_backend import startup_problem

    container = container_of(docs, f"{RELEASE}-llm-gateway")
    env: dict[str, str] = {}
    for entry in container["env"]:
        env[entry["name"]] = entry.get("value", "redis://from-a-secret:6379/0")
    workers = env["GATEWAY_WORKERS"]
    if workers == "auto":
        cpu = str(container["resources"].get("limits", {}).get("cpu", ""))
        cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu or NODE_CPUS)
        workers = str(min(NODE_CPUS, math.ceil(cores)))
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(docs))
    url = env.get("GATEWAY_REDIS_URL")
    settings = Settings(workers=int(workers), redis_url=None if url is None else SecretStr(url))
    return startup_problem(settings, load_checked_policy(path))


def policy_text(docs: list[dict[str, Any]]) -> str:
    text: str = one(docs, "ConfigMap", f"{RELEASE}-llm-gateway-policy")["data"]["policy.yaml"]
    return text


@pytest.mark.parametrize(
    ("sets", "refused"),
    [
        (("gateway.replicas=1",), True),  # auto on the default 2-CPU limit: 2 workers, no Redis
        (("gateway.replicas=1", "gateway.resources.limits.cpu=null"), True),  # the node's CPUs
        (("gateway.replicas=1", "gateway.resources.limits.cpu=1500m"), True),  # ceil: 2
        (("gateway.replicas=1", "gateway.workers=3"), True),
        (("redis.enabled=false",), True),
        (("gateway.replicas=1", "gateway.workers=1"), False),
        (("gateway.replicas=1", "gateway.resources.limits.cpu=1"), False),
        (("gateway.replicas=1", "redis.enabled=true"), False),
        (("gateway.replicas=1", "redis.url=redis://cache.example:6379/0"), False),
        (("gateway.replicas=1", "policy.state.redis_url=redis://cache.example:6379/0"), False),
        ((), False),  # two pods: redis.enabled auto runs the chart's Redis
    ],
)
def test_the_chart_refuses_per_key_limits_the_gateway_would_refuse_to_start_with(
    sets: tuple[str, ...],
    refused: bool,
    helm_template: Callable[..., str],
    render_chart: Render,
    tmp_path: Path,
) -> None:
    """A policy with per-key limits under several workers and no Redis stops the gateway at
    start-up (gateway/state_backend.py): the chart refuses exactly those values at render,
    naming what to change, and lets every other combination through."""
    output = helm_template(*TENANT, *sets, check=False)
    if not refused:
        assert gateway_would_refuse(render_chart(*TENANT, *sets), tmp_path) is None
        return
    assert "policy.limits: per-key rate limits with gateway.workers" in output
    assert "Set gateway.workers=1, or redis.enabled=true, or redis.url" in output
    # The same values with the chart's check taken out: the gateway would indeed not start.
    chart = tmp_path / "llm-gateway"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "gateway-deployment.yaml"
    check = re.compile(r'^\{\{- fail \(printf "policy\.limits:.*\n', re.MULTILINE)
    text, removed = check.subn("", template.read_text())
    assert removed == 1
    template.write_text(text)
    docs = [d for d in yaml.safe_load_all(helm_template(*TENANT, *sets, chart=chart)) if d]
    problem = gateway_would_refuse(docs, tmp_path)
    assert problem is not None and "per-key limits" in problem
