"""The chart's metrics path, from the scrape to the autoscaler: the ServiceMonitors select the
services, the PrometheusRule is the promtool-tested rules file whose recording rules take the max
over gateway pods (a sum would double the replicas), the HPA (through prometheus-adapter) and the
KEDA ScaledObjects read that recorded signal, and the Grafana dashboard plots only series the
gateway and the engines expose, in queries promtool parses. Negative twins prove the checks bite.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from gateway.telemetry import metrics as gateway_metrics
from replica import vllm_metrics
from tests.deploy import (
    CHART,
    NAMESPACE,
    RELEASE,
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

RULES_DIR = CHART / "prometheus"


# --- autoscaling --------------------------------------------------------------------------------


def rules_of_kind(kind: str) -> dict[str, str]:
    """The rules file's recording (``record``) or alerting (``alert``) rules: name -> expr."""
    groups = yaml.safe_load((RULES_DIR / "rules.yaml").read_text())["groups"]
    return {r[kind]: r["expr"] for g in groups for r in g["rules"] if kind in r}


def recorded_rules() -> dict[str, str]:
    return rules_of_kind("record")


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


# --- Prometheus Operator objects ------------------------------------------------------------------


def test_prometheus_rule_is_the_tested_rules_file(render_chart: Render) -> None:
    (rule,) = by_kind(render_chart("prometheusRule.enabled=true"), "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load((RULES_DIR / "rules.yaml").read_text())


@pytest.mark.parametrize("sets", [("serviceMonitor.enabled=true",), VARIANTS["picker-only"]])
def test_service_monitors_select_the_services(sets: tuple[str, ...], render_chart: Render) -> None:
    docs = render_chart(*sets)
    services = by_kind(docs, "Service")
    for monitor in by_kind(docs, "ServiceMonitor").values():
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        ports = {e["port"] for e in monitor["spec"]["endpoints"]}
        matched = [s for s in services.values() if wanted <= s["metadata"]["labels"].items()]
        assert matched, monitor["metadata"]["name"]
        for service in matched:
            assert ports <= {p["name"] for p in service["spec"]["ports"]}


def scraped_ports(docs: Docs) -> dict[str, set[int]]:
    """Per Deployment: the container ports some ServiceMonitor scrapes, through the Services
    that select its pods (port name -> targetPort -> the container's port)."""
    services = by_kind(docs, "Service").values()
    monitors = by_kind(docs, "ServiceMonitor").values()
    scraped: dict[str, set[int]] = {}
    for name, deployment in by_kind(docs, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"].items()
        (container, *_) = deployment["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        found: set[int] = set()
        for service in services:
            selector = service["spec"].get("selector") or {}
            if not selector or not selector.items() <= labels:
                continue
            by_port_name = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
            for monitor in monitors:
                if monitor["spec"]["selector"]["matchLabels"].items() <= (
                    service["metadata"]["labels"].items()
                ):
                    for endpoint in monitor["spec"]["endpoints"]:
                        target = by_port_name[endpoint["port"]]
                        found.add(target if isinstance(target, int) else named[target])
        scraped[name] = found
    return scraped


def test_the_picker_only_setup_scrapes_the_signal_the_autoscalers_read(
    render_chart: Render,
) -> None:
    """With gateway.replicas 0 the picker is the only exporter of gateway_pool_desired_replicas
    (`llm-gateway epp` serves the gateway's /metrics on its HTTP port): a ServiceMonitor must
    reach that port, or KEDA's query has no data and the pools never scale."""
    docs = render_chart(*VARIANTS["picker-only"])
    picker = f"{RELEASE}-llm-gateway-picker"
    assert one(docs, "Deployment", f"{RELEASE}-llm-gateway")["spec"]["replicas"] == 0
    assert by_kind(docs, "ScaledObject")
    assert scraped_ports(docs)[picker] == {8081}
    pod = one(docs, "Deployment", picker)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "--http-port" in container["args"]
    assert container["args"][container["args"].index("--http-port") + 1] == "8081"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8081"
    # The picker's monitor is its own: the gateway's and the vLLM pods' stay as they were.
    assert scraped_ports(docs)[f"{RELEASE}-llm-gateway"] == {8080}
    assert len(by_kind(render_chart("serviceMonitor.enabled=true"), "ServiceMonitor")) == 2
    assert len(by_kind(docs, "ServiceMonitor")) == 3


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


def test_every_gateway_series_the_dashboard_plots_is_in_the_contracts_table() -> None:
    """An operator reading a panel looks the series up in docs/contract.md's metrics table."""
    contract = (CHART.parents[1] / "docs" / "contract.md").read_text()
    documented = set(re.findall(r"^\| `(gateway_[a-z_]+)` \|", contract, re.MULTILINE))
    parts = ("_bucket", "_sum", "_count")
    used = {name for expr in dashboard_exprs() for name in _SERIES.findall(expr)}
    plotted = {
        next((n.removesuffix(p) for p in parts if n.endswith(p)), n)
        for n in used
        if n.startswith("gateway_")
    }
    assert plotted and plotted <= documented, plotted - documented


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


EJECTED_TEST = """
rule_files: [dashboard-ejected.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      # Every gateway process exports its own view: pod a's two workers and pod b.
      - {series: 'gateway_replica_ejected{pool="small", replica="r1", pod="a", worker="0"}', values: '1x3'}
      - {series: 'gateway_replica_ejected{pool="small", replica="r1", pod="a", worker="1"}', values: '1x3'}
      - {series: 'gateway_replica_ejected{pool="small", replica="r2", pod="a", worker="0"}', values: '0x3'}
      - {series: 'gateway_replica_ejected{pool="small", replica="r2", pod="b", worker="0"}', values: '1x3'}
      - {series: 'gateway_replica_ejected{pool="small", replica="r3", pod="b", worker="0"}', values: '0x3'}
      - {series: 'gateway_replica_ejected{pool="small", replica="r4", pod="b", worker="0"}', values: '1x3'}
      - {series: 'gateway_replica_ejected{pool="large", replica="r5", pod="a", worker="0"}', values: '0x3'}
    promql_expr_test:
      # r1 (ejected in three processes), r2 (in one of two) and r4: three replicas of "small".
      - expr: 'dashboard:ejected'
        eval_time: 30s
        exp_samples:
          - {labels: 'dashboard:ejected{pool="small"}', value: 3}
          - {labels: 'dashboard:ejected{pool="large"}', value: 0}
"""


def test_the_dashboard_counts_ejected_replicas_once_each(tools: Tools, tmp_path: Path) -> None:
    """gateway_replica_ejected is 0/1 per process: the panel shows how many replicas are out
    (each counted once however many processes eject it), not a max that stops at 1."""
    (expr,) = [e for e in dashboard_exprs() if "gateway_replica_ejected" in e]

    def promtool_test(query: str) -> int:
        rules = {"groups": [{"name": "d", "rules": [
            {"record": "dashboard:ejected", "expr": query.replace("$pool", ".*")}
        ]}]}  # fmt: skip
        (tmp_path / "dashboard-ejected.yaml").write_text(yaml.safe_dump(rules))
        (tmp_path / "ejected_test.yaml").write_text(EJECTED_TEST)
        done = run([tools.need("promtool"), "test", "rules", "ejected_test.yaml"], cwd=tmp_path)
        print(done.stdout + done.stderr)
        return done.returncode

    assert promtool_test(expr) == 0
    # The check bites: the old query (a max over the pool) reads 1.
    assert promtool_test('max by (pool) (gateway_replica_ejected{pool=~"$pool"})') != 0


# --- Prometheus rules ---------------------------------------------------------------------------


def test_promtool_checks_the_rules(tools: Tools) -> None:
    done = run([tools.need("promtool"), "check", "rules", RULES_DIR / "rules.yaml"])
    assert done.returncode == 0, done.stdout + done.stderr
    every = len(recorded_rules()) + len(rules_of_kind("alert"))
    assert f"SUCCESS: {every} rules found" in done.stdout


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
