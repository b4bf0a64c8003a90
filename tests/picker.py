"""Shared helpers of the endpoint-picker tests behind Envoy: the picker, Envoy and simulated
replicas as real processes (one pool, or two behind a tier), a long shared system prompt, a
replica that answers 503, and an OpenAI client for Envoy's listener."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from aiohttp import web
from openai import AsyncOpenAI

from bench.envoy import EnvoyProcess, start_envoy
from bench.launcher import GatewayProcess, start_picker
from gateway.picker.envoy_config import SUBSET, SUBSET_NAMESPACE
from tests.conftest import FAST_PROBES, pool_policy, running_sims
from tests.tiers import small_and_large, two_pools

SYSTEM = "You are the support assistant of a bicycle shop. " * 80


@contextlib.asynccontextmanager
async def behind_envoy(
    replicas: int = 2,
    *,
    fail_open: bool = True,
    more: Sequence[str] = (),
    sim: dict[str, Any] | None = None,
    subset: Callable[[list[str]], list[str]] | None = None,
    env: dict[str, str] | None = None,
    limits: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[GatewayProcess, EnvoyProcess, dict[str, Any]]]:
    """Simulated replicas, the picker and Envoy, all real processes; ``more``: the URLs of
    other replicas the pool lists; ``sim``: the simulated replicas' settings; ``subset``: from
    the replicas' ip:port, the subset of endpoints a filter ahead of the picker names; ``env``:
    the picker's settings; ``limits``: the policy's `limits:` section."""
    async with running_sims(replicas, **(sim or {})) as sims:
        policy = pool_policy([*(sim.url for sim in sims), *more])
        if limits is not None:
            policy["limits"] = limits
        picker = await start_picker(policy, env={**FAST_PROBES, **(env or {})})
        try:
            assert picker.picker_port is not None
            endpoints = [
                url.removeprefix("http://") for url in policy["pools"]["small"]["replicas"]
            ]
            filters = [subset_filter(subset(endpoints))] if subset is not None else []
            envoy = await start_envoy(
                policy, picker.picker_port, fail_open=fail_open, filters_first=filters
            )
            try:
                yield picker, envoy, policy
            finally:
                await envoy.stop()
        finally:
            await picker.stop()


@contextlib.asynccontextmanager
async def tiers_behind_envoy() -> AsyncIterator[EnvoyProcess]:
    """A small and a large pool of one simulated replica each behind the tier `auto`, the
    picker and Envoy, all real processes."""
    async with small_and_large() as pools:
        policy = two_pools(pools)
        picker = await start_picker(policy, env=FAST_PROBES)
        try:
            assert picker.picker_port is not None
            envoy = await start_envoy(policy, picker.picker_port)
            try:
                yield envoy
            finally:
                await envoy.stop()
        finally:
            await picker.stop()


def subset_filter(endpoints: list[str]) -> dict[str, Any]:
    """Envoy's set_metadata filter naming ``endpoints`` as the request's subset, as a gateway
    implementation in front of the picker would (the endpoint-picker protocol's subset)."""
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": SUBSET_NAMESPACE, "value": {SUBSET: endpoints}}],
        },
    }


class Unavailable:
    """A replica's completions handler that answers 503 every time (its health checks pass),
    counting the requests it got."""

    def __init__(self) -> None:
        self.tried = 0

    async def __call__(self, request: web.Request) -> web.Response:
        self.tried += 1
        error = {"error": {"message": "engine dead", "type": "InternalServerError", "code": 503}}
        return web.json_response(error, status=503)


def client(envoy: EnvoyProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{envoy.listen_url}/v1", api_key="unused", max_retries=0)
