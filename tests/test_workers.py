"""`llm-gateway serve --workers N`: N processes on one port (SO_REUSEPORT), sharing routing state
through Redis (named by GATEWAY_REDIS_URL or by the policy's `state:` section), stopped
together by one SIGTERM to the parent."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from bench.launcher import start_gateway
from gateway import headers
from tests.conftest import FAST_PROBES, chat, pool_policy, running_sims
from tests.redis_server import running_redis
from tests.test_shared_state_redis import NO_SHUTDOWN_DELAY, backend_up_is, eventually, system


@pytest.mark.parametrize("redis_named_by", ["GATEWAY_REDIS_URL", "the policy's state section"])
async def test_two_workers_share_one_port_and_stop_together(redis_named_by: str) -> None:
    async with running_redis() as redis, running_sims(2) as replicas:
        env = {**FAST_PROBES, **NO_SHUTDOWN_DELAY, "GATEWAY_WORKERS": "2"}
        policy = pool_policy([r.url for r in replicas])
        if redis_named_by == "GATEWAY_REDIS_URL":
            env["GATEWAY_REDIS_URL"] = redis.url
        else:
            policy = {**policy, "state": {"backend": "redis", "redis_url": redis.url}}
        gateway = await start_gateway(policy, env=env)
        try:
            prefixes = set()
            statuses = []
            for i in range(40):
                # A new connection each time: the kernel spreads connections over the workers.
                connector = aiohttp.TCPConnector(force_close=True)
                async with (
                    aiohttp.ClientSession(connector=connector) as session,
                    session.post(
                        f"{gateway.url}/v1/chat/completions", json=chat(system(i % 3), f"q{i}")
                    ) as response,
                ):
                    await response.read()
                    statuses.append(response.status)
                    # Request ids start with a random prefix of the process that made them.
                    prefixes.add(response.headers[headers.REQUEST_ID][:12])
            assert statuses == [200] * 40
            assert len(prefixes) == 2
            assert await eventually(backend_up_is(gateway, 1.0))  # sharing through that Redis
        finally:
            code = await gateway.stop()
        assert code == 0
        await asyncio.sleep(0)
