"""docker-compose.yml: `docker-compose config` accepts it under each profile and refuses a broken
copy, the vLLM services run exactly the launch recipes' argv, each gateway's mounted policy is
valid and names the services serving its models, and the simulated fleet's own commands, run as
local processes without Docker, serve both pools and the `auto` tier through the gateway.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bench.launcher import start_gateway
from gateway.settings import Settings
from replica.processes import ManagedProcess, free_port
from replica.vllm_launch import environment, render
from tests.deploy import COMPOSE, PROFILES, ROOT, Tools, run

pytestmark = pytest.mark.timeout(600)  # the first test also waits for the tools' install

# The tools fixture, from tests/deploy.py.


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


def test_compose_waits_out_each_gateways_shutdown_delay_and_drain() -> None:
    """Compose's stop SIGKILLs after stop_grace_period (10 s unless set): a gateway must get
    its delay + drain + the 5 s of margin the Helm chart asks for, from its own settings."""
    defaults = Settings()
    gateways = {
        name: spec
        for name, spec in compose_services().items()
        if "serve" in spec.get("command", [])
    }
    assert set(gateways) == {"gateway", "gateway-gpu", "gateway-a", "gateway-b"}
    for name, spec in gateways.items():
        env = spec.get("environment", {})
        delay = float(env.get("GATEWAY_SHUTDOWN_DELAY_S", defaults.shutdown_delay_s))
        drain = float(env.get("GATEWAY_DRAIN_TIMEOUT_S", defaults.drain_timeout_s))
        grace = spec.get("stop_grace_period", "10s")
        assert grace.endswith("s") and float(grace[:-1]) >= delay + drain + 5, name


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
