"""The Helm chart as a whole, checked by the real tools: `helm lint` and a dry-run install are
clean, every variant of the values renders valid Kubernetes 1.30 objects (unknown fields refused)
and the objects it promises, values the chart cannot honour are refused with a message naming
them, and each schema check has a negative twin that breaks a template and proves it bites.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.deploy import (
    CHART,
    CRD_KINDS,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    Render,
    Tools,
    by_kind,
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
    ],
)
def test_chart_refuses_bad_values_by_name(
    sets: tuple[str, ...], message: str, helm_template: Callable[..., str]
) -> None:
    output = helm_template(*sets, check=False)
    assert message in output


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
