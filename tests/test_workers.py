"""`llm-gateway serve --workers N`: N processes on one port (SO_REUSEPORT), sharing routing state
with each other (no Redis) or through Redis (named by GATEWAY_REDIS_URL or by the policy's
`state:` section), stopped together by one SIGTERM to the parent."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.host import children
from bench.launcher import gateway_argv, start_gateway
from gateway import headers
from replica.processes import ManagedProcess
from router_policies.tier_classifier_learned import MODEL_FORMAT
from tests.conftest import (
    FAST_PROBES,
    chat,
    eventually,
    get_text,
    metric_sum,
    pool_policy,
    running_sims,
)
from tests.redis_server import running_redis
from tests.shared_state import ADMIN_TOKEN, backend_up_is, every_worker_up, system
from tests.tiers import small_and_large, tiered_policy


@pytest.mark.parametrize(
    "redis_named_by", ["nothing (no Redis)", "GATEWAY_REDIS_URL", "the policy's state section"]
)
async def test_two_workers_share_one_port_and_stop_together(redis_named_by: str) -> None:
    async with running_redis() as redis, running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        policy = pool_policy([r.url for r in replicas])
        backend = "redis"
        if redis_named_by == "GATEWAY_REDIS_URL":
            env["GATEWAY_REDIS_URL"] = redis.url
        elif redis_named_by == "the policy's state section":
            policy = {**policy, "state": {"backend": "redis", "redis_url": redis.url}}
        else:
            backend = "workers"
        gateway = await start_gateway(policy, env=env)
        try:
            workers = set()
            for i in range(40):
                worker, _, _ = await fresh_connection_send(gateway, chat(system(i % 3), f"q{i}"))
                workers.add(worker)
            assert len(workers) == 2
            # Sharing, in each worker (/metrics answers for both, a series each).
            assert await eventually(backend_up_is(gateway, 2.0, backend))
        finally:
            code = await gateway.stop()
        assert code == 0
        await asyncio.sleep(0)


async def fresh_connection_send(
    gateway: ManagedProcess, body: dict[str, object]
) -> tuple[str, str, str]:
    """(serving worker, replica, route): a new connection, so the kernel picks the worker;
    request ids start with a random prefix of the process that made them."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=body) as response,
    ):
        await response.read()
        assert response.status == 200
        h = response.headers
        return h[headers.REQUEST_ID][:12], h[headers.REPLICA], h[headers.ROUTE]


async def test_without_redis_a_prefix_learned_through_one_worker_is_a_hit_through_the_other() -> (
    None
):
    async with running_sims(4) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        try:
            # Ready is one worker's answer: wait until both are connected to the other (a
            # dispatch before that is not shared).
            assert await eventually(every_worker_up(gateway))
            first, home, route = await fresh_connection_send(gateway, chat(system(1), "q0"))
            assert route == "prefix-home"
            await asyncio.sleep(0.3)  # well past the other worker's replay (a few ms)
            # Unshared, the other worker would find the same home by its hash but call it
            # "prefix-home" again: only a replayed dispatch makes it a hit.
            for i in range(1, 40):
                worker, replica, route = await fresh_connection_send(
                    gateway, chat(system(1), f"q{i}")
                )
                if worker != first:
                    assert (replica, route) == (home, "prefix-hit")
                    break
            else:
                pytest.fail("the kernel sent 40 new connections to the same worker")
        finally:
            assert await gateway.stop() == 0


async def test_every_scrape_answers_for_every_worker_whichever_one_it_reaches() -> None:
    # A counter read from one worker at a time jumps between their values and rate() sees a
    # share of the traffic: each scrape carries each worker's series, labelled by worker.
    async with running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        try:
            served_by = set()
            for i in range(30):
                worker, _, _ = await fresh_connection_send(gateway, chat(system(0), f"q{i}"))
                served_by.add(worker)
            assert len(served_by) == 2
            for _ in range(6):  # a new connection each: the kernel picks the worker scraped
                _, text = await get_text(f"{gateway.url}/metrics")
                families = {f.name: f for f in text_string_to_metric_families(text)}
                answered = sum(s.value for s in families["gateway_requests"].samples)
                assert answered == 30
                healthy = families["gateway_replica_healthy"].samples
                assert {s.labels["worker"] for s in healthy} == {"0", "1"}
                # Read by both from the parent's page: once, or a sum would count it twice.
                replaced = families["gateway_workers_replaced"].samples
                assert len(replaced) == 2  # one per reason
                assert all("worker" not in s.labels for s in replaced)
        finally:
            assert await gateway.stop() == 0


async def test_a_second_gateway_on_the_port_of_a_running_one_refuses_to_start() -> None:
    # Both would bind with SO_REUSEPORT and the kernel would split the port's connections.
    async with running_sims(1) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        policy = pool_policy([r.url for r in replicas])
        gateway = await start_gateway(policy, env=env)
        try:
            second = await asyncio.create_subprocess_exec(
                *gateway_argv(gateway.policy_path, int(gateway.url.rsplit(":", 1)[1])),
                env={**os.environ, **env},
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(30):
                _, err = await second.communicate()
            assert second.returncode == 2
            assert "cannot listen on" in err.decode()
        finally:
            assert await gateway.stop() == 0


async def test_without_redis_a_crashed_worker_is_replaced_in_its_place_and_rejoins() -> None:
    async with running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        try:
            assert await eventually(every_worker_up(gateway))
            assert gateway.pid is not None
            os.kill(children(gateway.pid)[0], signal.SIGKILL)
            # The replacement listens where its predecessor did; the survivor reconnects to it
            # and it to the survivor (a replacement in another place would never be reached).
            await asyncio.sleep(1.5)  # the parent waits 1 s before replacing a worker
            assert await eventually(every_worker_up(gateway), within_s=15)
        finally:
            assert await gateway.stop() == 0


async def test_a_stopped_worker_is_killed_and_replaced_and_every_request_is_served_again() -> None:
    async with running_sims(2) as replicas:
        env = {
            **FAST_PROBES, "GATEWAY_WORKERS": "2",
            "GATEWAY_WORKER_STUCK_S": "1",
        }  # fmt: skip
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        assert gateway.pid is not None
        parent = gateway.pid
        stopped = None
        try:
            assert await eventually(every_worker_up(gateway))
            stopped, survivor = children(parent)
            os.kill(stopped, signal.SIGSTOP)  # holds its socket, answers nothing

            async def replaced() -> bool:
                workers = children(parent)
                return len(workers) == 2 and stopped not in workers

            assert await eventually(replaced, within_s=15)
            assert survivor in children(parent)
            # Every new connection is answered again, by both workers.
            answered_by = set()
            for i in range(20):
                async with asyncio.timeout(5):
                    worker, _, _ = await fresh_connection_send(gateway, chat(system(0), f"q{i}"))
                answered_by.add(worker)
            assert len(answered_by) == 2
            assert (
                await metric_sum(gateway.url, "gateway_workers_replaced_total", reason="hung") == 1
            )
            assert (
                await metric_sum(gateway.url, "gateway_workers_replaced_total", reason="crashed")
                == 0
            )
            assert "sent no heartbeat" in gateway.log_tail()
        finally:
            if stopped is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped, signal.SIGCONT)  # were it still there, let it stop
            assert await gateway.stop() == 0


async def test_without_redis_a_reload_adding_per_key_limits_is_refused() -> None:
    # Each worker would hold its own buckets: two of them would let twice the limit through.
    async with running_sims(1) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        env["GATEWAY_ADMIN_TOKEN"] = ADMIN_TOKEN
        policy = pool_policy([r.url for r in replicas])
        gateway = await start_gateway(policy, env=env)
        try:
            tenant = {"api_key_sha256": ["ab" * 32], "requests_per_minute": 60}
            gateway.policy_path.write_text(
                yaml.safe_dump({**policy, "limits": {"tenants": {"acme": tenant}}})
            )
            auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{gateway.url}/admin/reload", headers=auth) as response,
            ):
                answer = await response.json()
            assert response.status == 422
            assert "per-key limits with 2 workers need" in answer["problems"][0]
        finally:
            assert await gateway.stop() == 0


async def routes_on_fresh_connections(gateway: ManagedProcess, n: int = 12) -> set[str]:
    """The routes ``n`` requests on new connections (so, through either worker) were given."""
    return {(await fresh_connection_send(gateway, chat(system(i), "q")))[2] for i in range(n)}


async def test_a_replacement_worker_starts_with_the_policy_file_its_siblings_reloaded() -> None:
    # Started with the policy the parent read at start-up, it would serve an old one for good
    # (its file watch sees nothing new): a tenant's revoked key would be let in again.
    async with running_sims(2) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2"}
        policy = pool_policy([r.url for r in replicas], "round-robin")
        gateway = await start_gateway(policy, env=env)
        assert gateway.pid is not None
        try:
            assert await eventually(every_worker_up(gateway))
            assert await routes_on_fresh_connections(gateway) == {"round-robin"}
            gateway.policy_path.write_text(yaml.safe_dump({**policy, "pools": {"small": {
                **policy["pools"]["small"], "policy": "least-loaded"}}}))  # fmt: skip

            async def reloaded() -> bool:
                return await routes_on_fresh_connections(gateway) == {"least-loaded"}

            assert await eventually(reloaded)
            # An edit that does not load: the workers keep least-loaded, so must a replacement.
            gateway.policy_path.write_text("pools: [")
            await asyncio.sleep(1.5)
            os.kill(children(gateway.pid)[0], signal.SIGKILL)
            await asyncio.sleep(1.5)  # the parent waits 1 s before replacing a worker
            assert await eventually(every_worker_up(gateway), within_s=15)
            assert await routes_on_fresh_connections(gateway, 24) == {"least-loaded"}
        finally:
            assert await gateway.stop() == 0


@contextlib.asynccontextmanager
async def two_workers() -> AsyncIterator[tuple[ManagedProcess, int]]:
    """A gateway of two workers over one replica, both up: (the gateway, the parent's pid)."""
    async with running_sims(1) as replicas:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2", "GATEWAY_SHUTDOWN_DELAY_S": "0"}
        gateway = await start_gateway(pool_policy([r.url for r in replicas]), env=env)
        assert gateway.pid is not None
        try:
            assert await eventually(every_worker_up(gateway))
            yield gateway, gateway.pid
        finally:
            await gateway.stop()


async def test_a_worker_ended_by_a_signal_of_its_own_is_replaced() -> None:
    # An operator's `kill PID`: it drains and exits 0, and the gateway is not stopping.
    async with two_workers() as (_, parent):
        ended = children(parent)[0]
        os.kill(ended, signal.SIGTERM)

        async def replaced() -> bool:
            workers = children(parent)
            return len(workers) == 2 and ended not in workers

        assert await eventually(replaced, within_s=15)


async def test_a_stop_while_a_worker_is_being_replaced_stops_the_gateway() -> None:
    async with two_workers() as (gateway, parent):
        os.kill(children(parent)[0], signal.SIGKILL)
        await asyncio.sleep(0.5)  # within the parent's 1 s pause before a replacement
        os.kill(parent, signal.SIGTERM)

        async def ended() -> bool:
            return gateway.returncode is not None

        assert await eventually(ended, within_s=15)
        assert gateway.returncode == 0


def write_tier_model(path: Path, bias: float) -> None:
    """A tier model scoring every request alike: sigmoid(``bias``); replaced by a rename, as
    a ConfigMap update does."""
    model = {"format": MODEL_FORMAT, "version": 1, "bias": bias, "weights": {}}
    path.with_suffix(".new").write_bytes(gzip.compress(orjson.dumps(model)))
    os.replace(path.with_suffix(".new"), path)


async def test_an_admin_reload_reaches_every_worker_though_only_a_file_it_names_changed(
    tmp_path: Path,
) -> None:
    # The policy file is unchanged, so no worker's file watch sees the retrained model.
    model = tmp_path / "tiers.json.gz"
    write_tier_model(model, -5.0)
    async with small_and_large() as pools:
        env = {**FAST_PROBES, "GATEWAY_WORKERS": "2", "GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN}
        policy = tiered_policy(pools, model=str(model))
        gateway = await start_gateway(policy, env=env)
        try:
            assert await eventually(every_worker_up(gateway))
            assert await tiers_on_fresh_connections(gateway) == {"small"}
            write_tier_model(model, 5.0)
            auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{gateway.url}/admin/reload", headers=auth) as response,
            ):
                assert response.status == 200 and (await response.json())["reloaded"]

            async def every_worker_reloaded() -> bool:
                return await tiers_on_fresh_connections(gateway) == {"large"}

            assert await eventually(every_worker_reloaded)
        finally:
            assert await gateway.stop() == 0


async def tiers_on_fresh_connections(gateway: ManagedProcess, n: int = 24) -> set[str]:
    """The tiers ``n`` requests to the tier model on new connections were given; asserts that
    both workers took some."""
    tiers, workers = set(), set()
    for i in range(n):
        body = {"model": "auto", "messages": [{"role": "user", "content": f"q{i}"}]}
        connector = aiohttp.TCPConnector(force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(f"{gateway.url}/v1/chat/completions", json=body) as response,
        ):
            assert response.status == 200, await response.text()
            tiers.add(response.headers[headers.TIER])
            workers.add(response.headers[headers.REQUEST_ID][:12])
    assert len(workers) == 2
    return tiers
