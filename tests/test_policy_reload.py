"""Live tuning: reloads that drop nothing, keep what was learned, and refuse broken files."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
import yaml

from bench.launcher import GatewayProcess, start_gateway
from gateway import headers
from gateway.policy.reload import KEYS_NO_LONGER_CHECKED
from replica.processes import ManagedProcess
from tests.conftest import (
    FAST_PROBES,
    MODEL,
    chat,
    eventually,
    get_text,
    metric,
    policy_holder,
    pool_policy,
    running_sims,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "test-admin-token"
URL = "http://127.0.0.1:9101"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
LARGE = "large-lora"
"""The tier's large pool: an adapter of the same replicas, so one set of sims serves both."""
ENV = {**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": TOKEN, "GATEWAY_POLICY_WATCH_INTERVAL_S": "0.2"}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def replicas() -> AsyncIterator[list[ManagedProcess]]:
    async with running_sims(2, decode_step_s=0.01, lora_modules=LARGE) as fleet:
        yield fleet


def policy(replicas: list[ManagedProcess], eps: float = 0.25) -> dict[str, Any]:
    return {
        "pools": {
            "small": {
                "model": MODEL,
                "replicas": [r.url for r in replicas],
                "load": {"balance_eps": eps},
            },
            "large": {"model": LARGE, "replicas": [r.url for r in replicas]},
        },
        "tiers": {"auto": {"small": "small", "large": "large"}},
    }


@pytest_asyncio.fixture(loop_scope="module")
async def gateway(replicas: list[ManagedProcess]) -> AsyncIterator[GatewayProcess]:
    gw = await start_gateway(policy(replicas), env=ENV)
    assert isinstance(gw, GatewayProcess)
    yield gw
    await gw.stop()


def rewrite(path: Path, data: dict[str, Any] | str) -> None:
    text = data if isinstance(data, str) else yaml.safe_dump(data)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic, as a ConfigMap update is


async def reloads(url: str, result: str) -> float:
    _, text = await get_text(f"{url}/metrics")
    return metric(text, "gateway_policy_reloads_total", result=result) or 0.0


async def last_reload_ok(url: str) -> float | None:
    _, text = await get_text(f"{url}/metrics")
    return metric(text, "gateway_policy_last_reload_successful")


async def stream(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, bool]:
    body = orjson.dumps(chat(f"Tenant {i % 7} prompt. " * 30, f"q{i}", max_tokens=30, stream=True))
    async with session.post(f"{url}/v1/chat/completions", data=body) as response:
        raw = await response.read()
        return response.status, raw.rstrip().endswith(b"data: [DONE]")


async def test_reloads_during_200_concurrent_streams_drop_none(
    gateway: GatewayProcess, replicas: list[ManagedProcess]
) -> None:
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as session:
        streams = [asyncio.create_task(stream(session, gateway.url, i)) for i in range(200)]
        await asyncio.sleep(0.3)
        rewrite(gateway.policy_path, policy(replicas, eps=0.5))
        async with session.post(f"{gateway.url}/admin/reload", headers=ADMIN) as response:
            assert response.status == 200
        await asyncio.sleep(0.3)
        os.kill(gateway.pid, signal.SIGHUP)
        await asyncio.sleep(0.3)
        rewrite(gateway.policy_path, policy(replicas, eps=0.75))  # picked up by the file watch
        results = await asyncio.gather(*streams)
    assert results == [(200, True)] * 200

    async def three_reloads() -> bool:
        return await reloads(gateway.url, "ok") >= 3

    assert await eventually(three_reloads)
    assert await reloads(gateway.url, "error") == 0
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.url}/admin/policy", headers=ADMIN) as response,
    ):
        assert (await response.json())["pools"]["small"]["load"]["balance_eps"] == 0.75


async def test_a_broken_file_changes_nothing_but_the_error_count_and_says_so_while_it_stays(
    gateway: GatewayProcess, replicas: list[ManagedProcess]
) -> None:
    sticky = chat("A long shared system prompt for stickiness. " * 30, "q")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=orjson.dumps(sticky)
        ) as r:
            home = r.headers[headers.REPLICA]
        ok_before = await reloads(gateway.url, "ok")
        for broken in (
            "pools: [this is: not valid",
            "pools:\n  small:\n    model: m\n    replicas: []\n",
        ):
            errors_before = await reloads(gateway.url, "error")
            rewrite(gateway.policy_path, broken)

            async def error_counted() -> bool:
                return await reloads(gateway.url, "error") > errors_before  # noqa: B023

            assert await eventually(error_counted)
        assert await reloads(gateway.url, "ok") == ok_before
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=orjson.dumps(sticky)
        ) as r:
            assert r.status == 200
            assert (r.headers[headers.REPLICA], r.headers[headers.ROUTE]) == (home, "prefix-hit")
        async with session.post(f"{gateway.url}/admin/reload", headers=ADMIN) as r:
            assert r.status == 422
            problems = (await r.json())["problems"]
        assert any("pools.small.replicas" in p and "line 4" in p for p in problems)
    # The error count has stopped rising (an alert on its increase clears); the gauge says the
    # file on disk is still not the policy in force, until one that loads replaces it.
    assert await last_reload_ok(gateway.url) == 0
    rewrite(gateway.policy_path, policy(replicas, eps=0.5))

    async def fixed() -> bool:
        return await last_reload_ok(gateway.url) == 1

    assert await eventually(fixed)


async def test_learned_prefixes_survive_a_reload(
    gateway: GatewayProcess, replicas: list[ManagedProcess]
) -> None:
    sticky = chat("Another long shared system prompt. " * 30, "q")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=orjson.dumps(sticky)
        ) as r:
            home = r.headers[headers.REPLICA]
        rewrite(gateway.policy_path, policy(replicas, eps=0.3))
        async with session.post(f"{gateway.url}/admin/reload", headers=ADMIN) as r:
            assert r.status == 200
        async with session.post(
            f"{gateway.url}/v1/chat/completions", data=orjson.dumps(sticky)
        ) as r:
            assert (r.headers[headers.REPLICA], r.headers[headers.ROUTE]) == (home, "prefix-hit")


async def test_admin_endpoints_need_the_token(
    gateway: GatewayProcess, replicas: list[ManagedProcess]
) -> None:
    async with aiohttp.ClientSession() as session:
        for sent in ({}, {"Authorization": "Bearer wrong"}):
            async with session.post(f"{gateway.url}/admin/reload", headers=sent) as r:
                assert r.status == 401
                assert (await r.json())["error"]["type"] == "authentication_error"
    closed = await start_gateway(policy(replicas), env=FAST_PROBES)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{closed.url}/admin/policy", headers=ADMIN) as r,
        ):
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "admin_disabled"
    finally:
        await closed.stop()


async def test_dry_run_explains_the_decision_without_sending(
    gateway: GatewayProcess, replicas: list[ManagedProcess]
) -> None:
    async def prompt_tokens() -> float:
        total = 0.0
        for replica in replicas:
            _, text = await get_text(f"{replica.url}/metrics")
            total += metric(text, "vllm:prompt_tokens_total") or 0.0
        return total

    before = await prompt_tokens()
    body = {
        "model": "auto",
        "messages": [
            {"role": "user", "content": "Prove that sqrt(2) is irrational, step by step."}
        ],
    }
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/admin/route", data=orjson.dumps(body), headers=ADMIN) as r,
    ):
        assert r.status == 200
        decision = await r.json()
    assert time.monotonic() - started < 5
    tier = decision["tier"]
    assert tier["tier"] in ("small", "large") and 0 < tier["score"] < 1
    assert decision["pool"] == tier["tier"] and decision["replica"] and decision["route"]
    # The learned model (the default) names the words that pushed the score up.
    assert tier["classifier"] == "learned"
    assert max(tier["contributions"].values()) > 0
    assert await prompt_tokens() == before


# -- the file watch, and what a reload says ------------------------------------------------------

TENANTS = {"limits": {"tenants": {"acme": {"api_key_sha256": ["a" * 64]}}}}


async def test_the_file_watch_reads_a_file_written_in_parts_once_it_stands_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**pool_policy([URL]), **TENANTS}, sort_keys=False))
    holder = policy_holder(path)
    whole = yaml.safe_dump(
        {**pool_policy([URL], load={"balance_eps": 0.5}), **TENANTS}, sort_keys=False
    )
    # An editor saving in place: what is on disk between its writes is a valid policy without
    # `limits:`, which read then would serve every caller without a key.
    path.write_text(whole[: whole.index("limits:")])
    assert not holder.settled_change()
    path.write_text(whole)
    assert not holder.settled_change()  # changed again since the last poll: still being written
    assert holder.settled_change()
    assert (await holder.reload()).ok
    policy = holder.fleet.policy
    assert policy.limits.tenants and policy.pools["small"].load.balance_eps == 0.5
    assert not holder.settled_change()


async def test_a_reload_that_drops_every_tenant_applies_and_says_keys_go_unchecked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**pool_policy([URL]), **TENANTS}))
    holder = policy_holder(path)
    path.write_text(yaml.safe_dump(pool_policy([URL])))
    result = await holder.reload()
    assert (result.ok, result.warnings) == (True, (KEYS_NO_LONGER_CHECKED,))
    assert not holder.fleet.policy.limits.tenants
