"""Issue 8, operators' mistakes: admin token, policy files, replica URLs, settings, start-up."""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import aiohttp
import pytest
import yaml
from pydantic import SecretStr, ValidationError

from bench.launcher import GatewayProcess, start_gateway
from gateway.settings import Settings, usable_cpus
from gateway.settings_errors import describe, load_settings
from tests.conftest import (
    FAST_PROBES,
    chat,
    eventually,
    get_text,
    metric,
    pool_policy,
    running_sims,
)
from tests.hardening import wait_for_log

BAD_URLS = ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://not a host"]


def llm_gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_an_empty_admin_token_means_admin_is_off() -> None:
    # Passed as the plain string the environment gives, which pydantic turns into a SecretStr.
    assert Settings(admin_token=cast(SecretStr, "")).admin_token is None
    assert Settings(admin_token=cast(SecretStr, "  ")).admin_token is None
    assert Settings(admin_token=cast(SecretStr, "t")).admin_token is not None


def test_the_admin_token_loses_the_whitespace_around_it() -> None:
    # A secret made from a file (`kubectl create secret --from-file`) keeps its final newline,
    # which no client sends.
    token = Settings(admin_token=cast(SecretStr, " \tsecret \r\n")).admin_token
    assert token is not None and token.get_secret_value() == "secret"


@pytest.mark.parametrize("host", ["", " ", "\t\n"])
def test_an_empty_host_means_loopback(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    # As `--host ""` passes it, then as GATEWAY_HOST="" from a compose file or chart does.
    assert Settings(host=host).host == "127.0.0.1"
    monkeypatch.setenv("GATEWAY_HOST", host)
    assert Settings().host == "127.0.0.1"
    monkeypatch.setenv("GATEWAY_HOST", " 0.0.0.0 ")
    assert Settings().host == "0.0.0.0"


async def test_serve_with_an_empty_host_listens_on_loopback_only() -> None:
    gw = await start_gateway(
        pool_policy(["http://127.0.0.1:9"]), env={"GATEWAY_HOST": ""}, wait_path="/health"
    )
    try:
        log = await wait_for_log(gw, "listening on")
        assert f"listening on {gw.url} " in log
    finally:
        await gw.stop()


_FLOAT_SETTINGS = [name for name, f in Settings.model_fields.items() if f.annotation is float]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_no_float_setting_takes_a_value_that_is_not_finite(value: float) -> None:
    assert len(_FLOAT_SETTINGS) > 10
    for name in _FLOAT_SETTINGS:
        with pytest.raises(ValidationError, match=name):
            Settings.model_validate({name: value})


def test_the_operations_guide_lists_every_setting() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    first_cells = [
        line.split("|")[1] for line in guide.splitlines() if line.startswith("| `GATEWAY_")
    ]
    listed = set(re.findall(r"`GATEWAY_([A-Z_]+)`", " ".join(first_cells)))
    assert listed == {name.upper() for name in Settings.model_fields}


async def test_with_an_empty_token_every_admin_endpoint_answers_403() -> None:
    async with running_sims(1) as [replica]:
        gw = await start_gateway(
            pool_policy([replica.url]), env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": ""}
        )
        try:
            async with aiohttp.ClientSession() as session:
                for method, path in (
                    ("POST", "/admin/reload"), ("GET", "/admin/policy"), ("POST", "/admin/route"),
                ):  # fmt: skip
                    for auth in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer"}):
                        async with session.request(
                            method, f"{gw.url}{path}", headers=auth, json={}
                        ) as response:
                            assert response.status == 403, (path, auth)
                            assert (await response.json())["error"]["code"] == "admin_disabled"
        finally:
            await gw.stop()


def test_compose_keeps_admin_off_and_the_port_on_loopback_by_default() -> None:
    compose = yaml.safe_load((Path(__file__).parent.parent / "docker-compose.yml").read_text())
    gateway = compose["services"]["gateway"]
    assert gateway["environment"]["GATEWAY_ADMIN_TOKEN"] == "${GATEWAY_ADMIN_TOKEN:-}"
    assert gateway["ports"] == ["${GATEWAY_PUBLISH:-127.0.0.1}:8080:8080"]


async def test_invalid_utf8_in_the_policy_is_refused_and_later_edits_still_apply() -> None:
    token = "t0ken"
    admin = {"Authorization": f"Bearer {token}"}
    async with running_sims(2) as replicas:
        gw = await start_gateway(
            pool_policy([replicas[0].url]),
            env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": token,
                 "GATEWAY_POLICY_WATCH_INTERVAL_S": "0.1"},
        )  # fmt: skip
        assert isinstance(gw, GatewayProcess)
        try:
            good = yaml.safe_dump(pool_policy([replicas[0].url])).encode()
            gw.policy_path.write_bytes(good + b"# caf\xe9\n")

            async def error_counted() -> bool:
                _, text = await get_text(f"{gw.url}/metrics")
                return metric(text, "gateway_policy_reloads_total", result="error") == 1.0

            assert await eventually(error_counted)
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{gw.url}/admin/reload", headers=admin) as response,
            ):
                assert response.status == 422
                assert "UTF-8" in " ".join((await response.json())["problems"])
            # The watch goes on: a later, valid edit is applied.
            gw.policy_path.write_text(yaml.safe_dump(pool_policy([r.url for r in replicas])))

            async def both_replicas_served() -> bool:
                status, text = await get_text(f"{gw.url}/ready")
                return status == 200 and '"small":2' in text

            assert await eventually(both_replicas_served)
        finally:
            await gw.stop()


@pytest.mark.parametrize("url", BAD_URLS)
def test_check_policy_refuses_an_unusable_replica_url(tmp_path: Path, url: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pool_policy(["http://127.0.0.1:8000", url])))
    result = llm_gateway("check-policy", str(path))
    assert result.returncode == 2
    assert "pools.small.replicas.1" in result.stderr and "Traceback" not in result.stderr


async def test_a_reload_refuses_an_unusable_replica_url() -> None:
    async with running_sims(1) as [replica]:
        gw = await start_gateway(
            pool_policy([replica.url]),
            env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": "t"},
        )
        assert isinstance(gw, GatewayProcess)
        try:
            async with aiohttp.ClientSession() as session:
                for url in BAD_URLS:
                    gw.policy_path.write_text(yaml.safe_dump(pool_policy([replica.url, url])))
                    async with session.post(
                        f"{gw.url}/admin/reload", headers={"Authorization": "Bearer t"}
                    ) as response:
                        assert response.status == 422, url
                async with session.get(
                    f"{gw.url}/admin/policy", headers={"Authorization": "Bearer t"}
                ) as response:
                    assert (await response.json())["pools"]["small"]["replicas"] == [replica.url]
        finally:
            await gw.stop()


def _policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pool_policy(["http://127.0.0.1:9"])))
    return path


@pytest.mark.parametrize(
    ("variable", "value"),
    [("GATEWAY_PORT", "abc"), ("GATEWAY_RETRIES", "-1"), ("GATEWAY_LOG_LEVEL", "LOUD"),
     ("GATEWAY_FIRST_TOKEN_TIMEOUT_S", "0"), ("GATEWAY_HEALTH_TIMEOUT_S", "inf"),
     ("GATEWAY_DRAIN_TIMEOUT_S", "Infinity")],
)  # fmt: skip
def test_a_bad_setting_is_one_clear_line_and_exit_code_2(
    tmp_path: Path, variable: str, value: str
) -> None:
    result = llm_gateway("serve", "--policy", str(_policy_file(tmp_path)), env={variable: value})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {variable}:")


def test_a_variable_that_is_no_setting_is_named_with_the_setting_it_resembles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ignored without a word, a typo would leave the default in force.
    monkeypatch.setenv("GATEWAY_RETRYS", "3")
    monkeypatch.setenv("GATEWAY_DRAIN_TIMEOUT", "99")
    # Kubernetes' service links of a Service named `gateway`, and compose's publish address.
    for name in ("GATEWAY_SERVICE_HOST", "GATEWAY_PORT_8080_TCP_ADDR", "GATEWAY_PUBLISH"):
        monkeypatch.setenv(name, "10.0.0.1")
    assert load_settings({}) is not None  # a warning, not a refusal
    assert capsys.readouterr().err.splitlines() == [
        "warning: GATEWAY_DRAIN_TIMEOUT is not a setting (did you mean GATEWAY_DRAIN_TIMEOUT_S?): "
        "ignored",
        "warning: GATEWAY_RETRYS is not a setting (did you mean GATEWAY_RETRIES?): ignored",
    ]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["serve", "--port", "99999"], "--port"),
        (["serve", "--workers", "many"], "--workers"),
        (["epp", "--port", "9002", "--http-port", "99999"], "--http-port"),
    ],
)
def test_a_bad_value_from_a_flag_names_the_flag_not_a_variable(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    result = llm_gateway(*flags, "--policy", str(_policy_file(tmp_path)))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {named}:")
    assert "GATEWAY_" not in line


def test_the_picker_refuses_workers_it_would_start_without_its_grpc_server(
    tmp_path: Path,
) -> None:
    # Only `serve` forks workers; epp's would serve HTTP with no picker for Envoy to ask.
    result = llm_gateway(
        "epp", "--port", "0", "--policy", str(_policy_file(tmp_path)),
        env={"GATEWAY_WORKERS": "2"},
    )  # fmt: skip
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: GATEWAY_WORKERS:")


def test_a_port_in_use_is_one_clear_line_and_exit_code_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = llm_gateway(
            "serve", "--policy", str(_policy_file(tmp_path)), "--port", str(port),
            env={"GATEWAY_HEALTH_TIMEOUT_S": "0.2"},
        )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr.strip().splitlines()[-1]


def test_the_charts_grace_period_covers_the_pre_stop_delay_and_the_drain() -> None:
    chart = Path(__file__).parent.parent / "helm" / "llm-gateway"
    values = yaml.safe_load((chart / "values.yaml").read_text())["gateway"]
    defaults = Settings()
    # The chart's defaults are the gateway's own, and they fit in the grace period.
    assert values["shutdownDelaySeconds"] == defaults.shutdown_delay_s
    assert values["drainTimeoutSeconds"] == defaults.drain_timeout_s
    assert (
        values["shutdownDelaySeconds"] + values["drainTimeoutSeconds"] + 5
        <= values["terminationGracePeriodSeconds"]
    )
    template = (chart / "templates" / "gateway-deployment.yaml").read_text()
    for variable in ("GATEWAY_SHUTDOWN_DELAY_S", "GATEWAY_DRAIN_TIMEOUT_S"):
        assert f"name: {variable}" in template
    assert "fail (printf" in template  # a combination that does not fit is refused at render


def test_helm_refuses_a_drain_longer_than_the_grace_period() -> None:
    helm = shutil.which("helm") or str(Path(__file__).parent.parent / ".cache/tools/bin/helm")
    if not Path(helm).exists():
        pytest.skip("helm is not installed (.ci/install-deploy-tools.sh installs it)")
    chart = str(Path(__file__).parent.parent / "helm" / "llm-gateway")
    fits = subprocess.run([helm, "template", "x", chart], capture_output=True, text=True)
    assert fits.returncode == 0, fits.stderr
    too_long = subprocess.run(
        [helm, "template", "x", chart, "--set", "gateway.drainTimeoutSeconds=58"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert too_long.returncode != 0
    assert "must not exceed gateway.terminationGracePeriodSeconds (60)" in too_long.stderr


@pytest.mark.parametrize(
    ("cpu_max", "expected"), [("max 100000\n", 4), ("150000 100000\n", 2), ("50000 100000\n", 1)]
)
def test_auto_workers_are_the_cpus_the_process_may_use_under_its_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    limit = tmp_path / "cpu.max"
    limit.write_text(cpu_max)
    assert usable_cpus(limit) == expected
    assert usable_cpus(tmp_path / "no-cgroup-v2") == 4


def test_workers_take_a_number_or_auto_and_the_chart_defaults_to_auto() -> None:
    # Passed as the strings GATEWAY_WORKERS holds, which the validator reads into an int.
    assert Settings(workers=cast(int, "auto")).workers == usable_cpus()
    assert Settings(workers=cast(int, "3")).workers == 3
    with pytest.raises(ValidationError, match="or 'auto'"):
        Settings(workers=cast(int, "many"))
    chart = Path(__file__).parent.parent / "helm" / "llm-gateway"
    assert yaml.safe_load((chart / "values.yaml").read_text())["gateway"]["workers"] == "auto"
    template = (chart / "templates" / "gateway-deployment.yaml").read_text()
    assert "name: GATEWAY_WORKERS" in template


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_prompts_are_logged_only_when_the_operator_turns_it_on(log_prompts: bool) -> None:
    env = {**FAST_PROBES, "GATEWAY_LOG_PROMPTS": str(log_prompts).lower()}
    async with running_sims(1) as [replica]:
        gateway = await start_gateway(pool_policy([replica.url]), env=env)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{gateway.url}/v1/chat/completions",
                    json=chat("a system prompt", "the zebra's marmalade recipe"),
                    headers={"x-request-id": "prompt-log-1"},
                ) as response,
            ):
                assert response.status == 200
            logged = [line for line in gateway.log_tail().splitlines() if "zebra" in line]
        finally:
            await gateway.stop()
        if log_prompts:
            assert len(logged) == 1
            assert "[prompt-log-1]" in logged[0] and "a system prompt" in logged[0]
        else:
            assert logged == []


def test_a_rule_between_two_settings_names_both_variables(tmp_path: Path) -> None:
    result = llm_gateway(
        "serve", "--policy", str(_policy_file(tmp_path)),
        env={"GATEWAY_OUTLIER_BASE_EJECTION_S": "100", "GATEWAY_OUTLIER_MAX_EJECTION_S": "10"},
    )  # fmt: skip
    assert result.returncode == 2
    # Before: "error: settings: Value error, outlier_max_ejection_s must be >= ...", which
    # named two fields and no variable.
    assert result.stderr.strip().splitlines() == [
        "error: GATEWAY_OUTLIER_MAX_EJECTION_S: must be at least "
        "GATEWAY_OUTLIER_BASE_EJECTION_S, which is 100.0 (got 10.0)"
    ]


def test_a_settings_error_says_only_what_is_wrong(tmp_path: Path) -> None:
    result = llm_gateway(
        "serve", "--policy", str(_policy_file(tmp_path)), env={"GATEWAY_WORKERS": "many"}
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: GATEWAY_WORKERS: a number of processes, or 'auto' (one per usable CPU) (got 'many')"
    ]


@pytest.mark.parametrize("port", ["", " "])
def test_an_empty_port_means_the_default_port(monkeypatch: pytest.MonkeyPatch, port: str) -> None:
    # As GATEWAY_HOST="" means loopback: a compose file or chart passes "" for "unset".
    monkeypatch.setenv("GATEWAY_PORT", port)
    assert Settings().port == 8080
    monkeypatch.setenv("GATEWAY_PORT", "9000")
    assert Settings().port == 9000


@pytest.mark.parametrize(
    ("name", "read"),
    [
        ("GATEWAY_WORKERS", lambda s: s.workers == 1),
        ("GATEWAY_LOG_LEVEL", lambda s: s.log_level == "INFO"),
        ("GATEWAY_POLICY", lambda s: s.policy is None),  # not ".", a directory to read
        ("GATEWAY_RETRIES", lambda s: s.retries == 1),
    ],
)
def test_every_empty_setting_means_its_default(
    monkeypatch: pytest.MonkeyPatch, name: str, read: Callable[[Settings], bool]
) -> None:
    monkeypatch.setenv(name, "")
    assert read(Settings())


def test_shared_counts_that_would_expire_between_two_writes_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_STATE_TTL_S", "0.1")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert describe(refused.value) == [
        "error: GATEWAY_STATE_TTL_S: must be at least twice GATEWAY_STATE_SYNC_INTERVAL_S, "
        "which is 0.075 (got 0.1)"
    ]
