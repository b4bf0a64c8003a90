"""The chart's custom resources against their own models, as the API server would check them:
KEDA's ScaledObject and the Prometheus Operator's ServiceMonitor and PrometheusRule against
cloudcoil's models, the InferencePool against the Gateway API Inference Extension's CRD (unknown
fields refused), each with a negative twin; and the endpoint picker that InferencePool points at
serves the gateway's policy and selects every vLLM pod.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deploy import (
    CRD_KINDS,
    RELEASE,
    ROOT,
    VARIANTS,
    Docs,
    Render,
    Tools,
    by_kind,
    one,
    run,
    sts_name,
)

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the tools' install

INFERENCE_POOL_CRD = (
    ROOT / "tests" / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
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
    argv: list[str | Path] = [tools.need("venv_python"), "-c", CHECK_CRDS, INFERENCE_POOL_CRD]
    done = run(argv, stdin=json.dumps(crds))
    assert done.returncode == 0, done.stderr
    problems: list[str] = json.loads(done.stdout)
    return problems


def test_crds_validate_against_their_models(tools: Tools, render_chart: Render) -> None:
    """ScaledObject (KEDA), ServiceMonitor and PrometheusRule (Prometheus Operator), and the
    InferencePool against the Gateway API Inference Extension's CRD."""
    docs = render_chart(*VARIANTS["everything"]) + render_chart(*VARIANTS["picker"])
    docs += render_chart(*VARIANTS["picker-only"])  # the picker's own ServiceMonitor
    assert {"ScaledObject", "InferencePool"} <= {d["kind"] for d in docs}
    assert f"{RELEASE}-llm-gateway-picker" in by_kind(docs, "ServiceMonitor")
    assert check_crds(tools, docs) == []


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
