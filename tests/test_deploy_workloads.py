"""The workloads the Helm chart runs: the gateway's policy in its ConfigMap passes
`check-policy` and lists each vLLM replica pod by its stable DNS name, the vLLM containers run
exactly the argv of the launch recipes (replica/vllm_launch.py, through the generated
files/vllm-args.yaml), and the gateway Deployment runs the container contract (probes, non-root,
admin token from a Secret, a policy mount that sees ConfigMap updates, rolls on policy changes).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from replica import vllm_launch_helm
from replica.vllm_launch import environment, gpu_small_profile, render
from tests.deploy import (
    CHART,
    NAMESPACE,
    PROFILES,
    RELEASE,
    ROOT,
    VARIANTS,
    Docs,
    Render,
    by_kind,
    one,
    policy_of,
    run,
    sts_name,
)

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the tools' install


# --- the policy in the ConfigMap ----------------------------------------------------------------


@pytest.mark.parametrize("variant", ["default", "autoscaling-hpa", "one-pool", "external-replicas"])
def test_rendered_policy_passes_check_policy(
    variant: str, render_chart: Render, tmp_path: Path
) -> None:
    policy = render_chart(*VARIANTS[variant])
    text = one(policy, "ConfigMap", f"{RELEASE}-llm-gateway-policy")["data"]["policy.yaml"]
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    done = run([sys.executable, "-m", "gateway.cli", "check-policy", path], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    effective = yaml.safe_load(done.stdout)
    assert effective["pools"]["small"]["model"] == "llama-3.1-8b"


def test_policy_lists_each_replica_pod_by_its_stable_dns_name(render_chart: Render) -> None:
    """A StatefulSet pod is <sts>-<i>.<serviceName>.<ns>.svc: the URLs must match what the
    chart creates, one per replica the pool may have (max under autoscaling)."""
    for sets, counts in (
        ((), {"small": 1, "large": 1}),
        (("autoscaling.mode=hpa",), {"small": 4, "large": 2}),
    ):
        docs = render_chart(*sets)
        policy = policy_of(docs)
        for pool, count in counts.items():
            sts = one(docs, "StatefulSet", sts_name(pool))
            service = one(docs, "Service", sts["spec"]["serviceName"])
            assert service["spec"]["clusterIP"] == "None"  # headless: per-pod DNS records
            assert (
                service["spec"]["selector"].items()
                <= sts["spec"]["template"]["metadata"]["labels"].items()
            )
            port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            expected = [
                f"http://{sts_name(pool)}-{i}.{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}"
                for i in range(count)
            ]
            assert policy["pools"][pool]["replicas"] == expected
            entry = policy["pools"][pool]
            assert entry["autoscale"] == {
                "min_replicas": 1,
                "max_replicas": 4 if pool == "small" else 2,
                "target_rate_per_replica": 8 if pool == "small" else 2,
            }
        assert ("replicas" in one(docs, "StatefulSet", sts_name("small"))["spec"]) == (not sets)
    assert policy_of(render_chart())["pools"]["large"]["tensor_parallel_size"] == 2
    assert policy_of(render_chart())["tiers"]["auto"]["small"] == "small"


# --- the vLLM containers: one source of truth -----------------------------------------------------


def vllm_container(docs: Docs, pool: str) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "StatefulSet", sts_name(pool))["spec"]["template"][
        "spec"
    ]["containers"][0]
    return container


def test_committed_vllm_args_file_is_the_generators_output() -> None:
    committed = (CHART / "files" / "vllm-args.yaml").read_text()
    assert committed == vllm_launch_helm.render_file(), (
        "helm/llm-gateway/files/vllm-args.yaml is stale: run python -m replica.vllm_launch_helm"
    )
    assert vllm_launch_helm.main(["--check"]) == 0


def test_generator_check_notices_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "vllm-args.yaml"
    stale.write_text(vllm_launch_helm.render_file().replace("'256'", "'255'"))
    assert vllm_launch_helm.main(["--check", "--output", str(stale)]) == 1
    assert vllm_launch_helm.main(["--output", str(stale)]) == 0
    assert vllm_launch_helm.main(["--check", "--output", str(stale)]) == 0


@pytest.mark.parametrize(("pool", "profile"), [("small", "gpu-small"), ("large", "gpu-large")])
def test_vllm_command_is_the_recipes_argv(pool: str, profile: str, render_chart: Render) -> None:
    container = vllm_container(render_chart(), pool)
    expected = PROFILES[profile]()
    assert container["command"] + container["args"] == render(expected)
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == expected.tensor_parallel_size
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert environment(expected).items() <= env.items()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    volumes = {
        v["name"]: v
        for v in one(render_chart(), "StatefulSet", sts_name(pool))["spec"]["template"]["spec"][
            "volumes"
        ]
    }
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes["model-cache"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_vllm_command_follows_model_overrides(render_chart: Render) -> None:
    docs = render_chart(
        "pools.small.model=Qwen/Qwen2.5-7B-Instruct",
        "pools.small.servedModelName=qwen-7b",
        "pools.small.extraArgs={--max-model-len,16384}",
        "pools.small.profile=gpu-small",
    )
    container = vllm_container(docs, "small")
    expected = gpu_small_profile("Qwen/Qwen2.5-7B-Instruct", "qwen-7b").model_copy(
        update={"extra_args": ("--max-model-len", "16384")}
    )
    assert container["command"] + container["args"] == render(expected)
    assert policy_of(docs)["pools"]["small"]["model"] == "qwen-7b"


def test_pvc_model_cache_is_one_claim_per_replica(render_chart: Render) -> None:
    sts = one(render_chart("vllm.modelCache.type=pvc"), "StatefulSet", sts_name("large"))
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "model-cache"
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert "model-cache" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


# --- the gateway Deployment ---------------------------------------------------------------------


def test_gateway_deployment_runs_the_contract(render_chart: Render) -> None:
    docs = render_chart("gateway.adminToken=s3cret")
    deployment = one(docs, "Deployment", f"{RELEASE}-llm-gateway")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    policy_path = env["GATEWAY_POLICY"]["value"]
    assert container["args"] == ["serve", "--policy", "$(GATEWAY_POLICY)"]
    assert env["GATEWAY_HOST"]["value"] == "0.0.0.0"
    assert env["GATEWAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"
    secret = one(docs, "Secret", env["GATEWAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"])
    assert "admin-token" in secret["data"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready?pools=any"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    policy_mount = mounts[str(Path(policy_path).parent)]
    assert "subPath" not in policy_mount  # a subPath mount would never see ConfigMap updates
    configmap = volumes[policy_mount["name"]]["configMap"]["name"]
    assert Path(policy_path).name in one(docs, "ConfigMap", configmap)["data"]
    pdb = one(docs, "PodDisruptionBudget", f"{RELEASE}-llm-gateway")
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    service = one(docs, "Service", f"{RELEASE}-llm-gateway")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    no_token = one(render_chart(), "Deployment", f"{RELEASE}-llm-gateway")
    names = {e["name"] for e in no_token["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "GATEWAY_ADMIN_TOKEN" not in names
    assert f"{RELEASE}-llm-gateway-admin" not in by_kind(render_chart(), "Secret")


@pytest.mark.parametrize("name", ["llm-gateway", "llm-gateway-picker"])
def test_policy_checksum_rolls_pods_only_when_asked(render_chart: Render, name: str) -> None:
    def checksum(*sets: str) -> str | None:
        docs = render_chart("picker.enabled=true", *sets)
        deployment = one(docs, "Deployment", f"{RELEASE}-{name}")
        value: str | None = deployment["spec"]["template"]["metadata"]["annotations"].get(
            "checksum/policy"
        )
        return value

    base = checksum()
    assert base is not None and re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum("pools.small.policy.max_inflight_per_replica=64") not in (None, base)
    assert checksum("gateway.rollOnPolicyChange=false") is None


# --- the picker's stop ------------------------------------------------------------------------


def stop_settings(docs: Docs, name: str) -> tuple[int, dict[str, str | None]]:
    pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    wanted = ("GATEWAY_SHUTDOWN_DELAY_S", "GATEWAY_DRAIN_TIMEOUT_S")
    return pod.get("terminationGracePeriodSeconds", 30), {k: env.get(k) for k in wanted}


@pytest.mark.parametrize(
    "sets",
    [
        (),
        (
            "gateway.shutdownDelaySeconds=10",
            "gateway.drainTimeoutSeconds=100",
            "gateway.terminationGracePeriodSeconds=120",
        ),
    ],
)
def test_the_picker_stops_like_the_gateway_within_its_grace_period(
    sets: tuple[str, ...], render_chart: Render
) -> None:
    """The picker runs the gateway's stop (delay, then the drain of what is in flight, the gRPC
    streams Envoy relays included): it gets the same settings and a grace period that holds
    them, not Kubernetes' default 30 s, which would SIGKILL it 25 s into a 45 s drain."""
    docs = render_chart(*VARIANTS["picker-only"], *sets)
    gateway = stop_settings(docs, f"{RELEASE}-llm-gateway")
    grace, env = stop_settings(docs, f"{RELEASE}-llm-gateway-picker")
    assert (grace, env) == gateway
    delay, drain = (float(v or "nan") for v in env.values())
    assert delay + drain + 5 <= grace


def test_the_chart_refuses_a_drain_the_pickers_grace_period_cannot_hold(
    helm_template: Callable[..., str],
) -> None:
    output = helm_template(*VARIANTS["picker-only"], "gateway.drainTimeoutSeconds=58", check=False)
    assert "must not exceed gateway.terminationGracePeriodSeconds (60)" in output
    assert "picker" in output
