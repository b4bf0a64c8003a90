"""Starting the gateway as a real subprocess, for tests, the demo and benchmarks.

The gateway is exercised the way operators run it (``llm-gateway serve`` with a policy file),
so what a test or benchmark measures includes the real process, event loop and sockets.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from replica.processes import ManagedProcess, free_port, start_on_free_port

_HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
"""How long a router (the gateway's or a peer's) may take to answer ready: an interpreter
starting beside two vLLM engines that hold both cores took over 30 s in a full compare run."""
NO_SHUTDOWN_DELAY = {"GATEWAY_SHUTDOWN_DELAY_S": "0"}
"""Every child's default: ``shutdown_delay_s`` keeps a stopping gateway accepting requests
while a load balancer takes it out of rotation, and a child of a test or a benchmark has none
in front of it. Left at 5 s, each stop waited out the stop's own grace and ended in SIGKILL.
A caller's ``env`` that names the variable wins."""


class GatewayProcess(ManagedProcess):
    """A gateway child that owns its policy file and removes it once the process is gone."""

    def __init__(
        self,
        argv: Sequence[str],
        url: str,
        policy_path: Path,
        *,
        env: Mapping[str, str | None] | None = None,
        picker_port: int | None = None,
    ) -> None:
        super().__init__(argv, url, env={**NO_SHUTDOWN_DELAY, **(env or {})}, name="gateway")
        self.policy_path = policy_path
        self.picker_port = picker_port
        """The gRPC port of `llm-gateway epp` (None for `serve`)."""

    async def stop(self, grace_s: float = 5.0) -> int | None:
        try:
            return await super().stop(grace_s)
        finally:
            self.policy_path.unlink(missing_ok=True)

    async def kill(self) -> None:
        try:
            await super().kill()
        finally:
            self.policy_path.unlink(missing_ok=True)


def gateway_argv(policy_path: Path, port: int, python: str = sys.executable) -> list[str]:
    """The command line of one gateway: the same entry point as the ``llm-gateway`` script,
    run by ``python`` (this interpreter by default)."""
    return [
        python,
        "-m",
        "gateway.cli",
        "serve",
        "--policy",
        str(policy_path),
        "--port",
        str(port),
    ]


async def start_picker(
    policy: Mapping[str, Any],
    *,
    picker_port: int | None = None,
    env: Mapping[str, str | None] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> GatewayProcess:
    """Start ``llm-gateway epp`` (the endpoint picker for Envoy) with ``policy``; its HTTP
    side (/ready, /metrics, the admin API) at ``url``, its gRPC port ``picker_port`` (a free
    one by default). Waits until /ready is 200."""
    grpc_port = picker_port if picker_port is not None else free_port(_HOST)

    def build(chosen: int) -> GatewayProcess:
        policy_path = _write_policy(policy)
        argv = [
            sys.executable, "-m", "gateway.cli", "epp", "--policy", str(policy_path),
            "--port", str(grpc_port), "--http-port", str(chosen),
        ]  # fmt: skip
        url = f"http://{_HOST}:{chosen}"
        return GatewayProcess(argv, url, policy_path, env=env, picker_port=grpc_port)

    async def start(process: GatewayProcess) -> None:
        await process.start(health_path="/ready", timeout_s=ready_timeout_s)

    return await start_on_free_port(build, start, host=_HOST)


def _write_policy(policy: Mapping[str, Any]) -> Path:
    fd, name = tempfile.mkstemp(prefix="gateway-policy-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        yaml.safe_dump(dict(policy), out, sort_keys=False)
    return Path(name)


async def start_gateway(
    policy: Mapping[str, Any],
    *,
    port: int | None = None,
    env: Mapping[str, str | None] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    wait_path: str = "/ready",
    python: str = sys.executable,
) -> GatewayProcess:
    """Start ``llm-gateway serve`` on loopback with ``policy``; wait until ``wait_path`` is 200.

    ``policy`` is the policy file's content as plain data. With no ``port`` a free one is
    picked, and picked again if another process takes it before the gateway binds. ``env``
    adds GATEWAY_* (or any) variables to the child's environment (one set to None is left
    out). ``wait_path="/health"`` starts a gateway some of whose pools are meant to have no
    healthy replica. ``python``
    runs it: another interpreter with the project's dependencies installed runs this
    checkout's code (``-m`` reads the working directory first). Stop the
    result with ``await process.stop()``; that also removes the temporary policy file.
    """

    def build(chosen: int) -> GatewayProcess:
        policy_path = _write_policy(policy)
        url = f"http://{_HOST}:{chosen}"
        argv = gateway_argv(policy_path, chosen, python)
        return GatewayProcess(argv, url, policy_path, env=env)

    async def start(process: GatewayProcess) -> None:
        await process.start(health_path=wait_path, timeout_s=ready_timeout_s)

    return await start_on_free_port(build, start, host=_HOST, port=port)
