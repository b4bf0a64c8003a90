"""The probe rounds: one pool's trouble must not stop the rounds' work on the others, nor one
replica's metrics that cannot be read (a missed scrape, logged once); a reload's new replicas
are probed at once; each change of health is logged once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import web

from gateway.fleet.monitor import ANSWER_MAX_BYTES, ProbeSettings, ReplicaMonitor
from gateway.fleet.pools import Fleet
from gateway.fleet.replicas import EngineStats
from router_policies.schema import parse_policy
from tests.conftest import eventually, fake_replica

PROBES = ProbeSettings(
    health_interval_s=1, health_timeout_s=1, unhealthy_after=1, healthy_after=1,
    scrape_interval_s=1,
)  # fmt: skip
MONITOR = "gateway.fleet.monitor"
"""Its logger: a line another test's leftovers log meanwhile (asyncio's) is not its."""


def two_pools() -> Fleet:
    pools = {
        name: {"model": name, "replicas": [f"http://127.0.0.1:{port}"]}
        for name, port in (("first", 9201), ("second", 9202))
    }
    return Fleet(parse_policy({"pools": pools}))


async def test_one_pool_failing_its_autoscale_update_leaves_the_others_updated_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = two_pools()
    first, second = fleet.pools["first"], fleet.pools["second"]

    def broken(now: float) -> None:
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(first, "update_desired", broken)
    for pool in (first, second):
        for replica in pool.replicas.values():
            replica.healthy = False  # nothing to scrape: the round only updates the signals
        for _ in range(40):
            pool.queue.join(0)  # requests waiting in the gateway: the signal asks for more
    async with aiohttp.ClientSession() as session:
        monitor = ReplicaMonitor(lambda: fleet, session, PROBES)
        with caplog.at_level(logging.ERROR, logger=MONITOR):
            await monitor.scrape_once()
            await monitor.scrape_once()

    assert (second.autoscale.desired or 0) > 1
    assert [r.getMessage() for r in caplog.records] == ["autoscaling update of pool first failed"]


@contextlib.asynccontextmanager
async def serving_metrics(
    body: bytes,
    content_type: str = "text/plain",
    status: int = 200,
    *,
    gzips: bool = False,
    delay_s: float = 0.0,
) -> AsyncIterator[str]:
    """A replica whose /metrics answers ``body`` (after ``delay_s``); ``gzips``: compressed for
    a client accepting gzip, as prometheus_client's exporter (vLLM's /metrics mount) answers."""

    async def metrics(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        if gzips and "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=gzip.compress(body), headers={"Content-Encoding": "gzip"})
        return web.Response(body=body, content_type=content_type, charset="utf-8", status=status)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


UNREADABLE_METRICS = {
    "a value not a number": (b'vllm:num_requests_running{model_name="first"} many\n', "text/plain", 200),
    "a label left open": (b'vllm:num_requests_waiting{model_name="first} 1\n', "text/plain", 200),
    "not UTF-8": (b"vllm:num_requests_running 1\n\xff\xfe\n", "text/plain", 200),
    "an HTML page": (b"<html><body>Bad gateway</body></html>", "text/html", 200),
    "longer than the gateway reads": (
        b'vllm:num_requests_running{model_name="first"} 1\n' * (ANSWER_MAX_BYTES // 48 + 1),
        "text/plain", 200,
    ),
    "refused (an --api-key engine's 401)": (b'{"error": "Unauthorized"}', "application/json", 401),
}  # fmt: skip


@pytest.mark.parametrize(("body", "content_type", "status"), UNREADABLE_METRICS.values(), ids=UNREADABLE_METRICS.keys())  # fmt: skip
async def test_metrics_that_cannot_be_read_are_a_missed_scrape_of_that_replica_logged_once(
    body: bytes, content_type: str, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        serving_metrics(body, content_type, status) as unreadable,
        serving_metrics(b'vllm:num_requests_waiting{model_name="second"} 50\n') as readable,
        aiohttp.ClientSession() as session,
    ):
        pools = {"first": [unreadable], "second": [readable]}
        fleet = Fleet(parse_policy({"pools": {n: {"model": n, "replicas": r} for n, r in pools.items()}}))  # fmt: skip
        (first,), (second,) = (pool.replicas.values() for pool in fleet.pools.values())
        first.engine = EngineStats(running=3.0, waiting=4.0)  # the last scrape's
        monitor = ReplicaMonitor(lambda: fleet, session, PROBES)
        with caplog.at_level(logging.WARNING, logger=MONITOR):
            await monitor.scrape_once()
            await monitor.scrape_once()
    assert first.engine == EngineStats(running=3.0, waiting=4.0)
    assert second.engine.waiting == 50 and (fleet.pools["second"].autoscale.desired or 0) > 1
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == MONITOR] == [
        f"metrics of replica {first.name} of pool first cannot be read"
    ]


async def test_a_replica_a_reload_removed_is_forgotten_and_news_again_if_it_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Replicas come and go with the HPA: the scrapes once missed are not kept for ever."""
    async with (
        serving_metrics(b"<html>Bad gateway</html>", "text/html") as unreadable,
        serving_metrics(b"vllm:num_requests_waiting 1\n") as readable,
        aiohttp.ClientSession() as session,
    ):
        fleets = [Fleet(parse_policy(one_pool([unreadable])))]
        monitor = ReplicaMonitor(lambda: fleets[-1], session, PROBES)
        with caplog.at_level(logging.WARNING, logger=MONITOR):
            for replicas in ([unreadable], [readable], [unreadable]):
                fleets.append(Fleet(parse_policy(one_pool(replicas))))
                await monitor.scrape_once()
    assert len([r for r in caplog.records if r.name == MONITOR]) == 2


async def test_metrics_slower_than_the_scrape_timeout_are_a_missed_scrape_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Figures kept from the last scrape feed routing and the HPA: one no scrape can renew is
    said, as unreadable ones are."""
    async with (
        serving_metrics(b"vllm:num_requests_running 1\n", delay_s=1.0) as slow,
        aiohttp.ClientSession() as session,
    ):
        fleet = Fleet(parse_policy({"pools": {"first": {"model": "first", "replicas": [slow]}}}))
        [first] = fleet.pools["first"].replicas.values()
        first.engine = EngineStats(running=3.0, waiting=4.0)  # the last scrape's
        probes = dataclasses.replace(PROBES, scrape_interval_s=0.1)  # a timeout of 0.5 s
        monitor = ReplicaMonitor(lambda: fleet, session, probes)
        with caplog.at_level(logging.WARNING, logger=MONITOR):
            await monitor.scrape_once()
            await monitor.scrape_once()
    assert first.engine == EngineStats(running=3.0, waiting=4.0)
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == MONITOR] == [
        f"metrics of replica {first.name} of pool first could not be fetched"
    ]


async def test_metrics_an_exporter_would_gzip_are_asked_for_uncompressed_and_read() -> None:
    async with (
        serving_metrics(b'vllm:num_requests_waiting{model_name="first"} 7\n', gzips=True) as url,
        # The gateway's session: it relays answers as they come, never decompressing.
        aiohttp.ClientSession(auto_decompress=False) as session,
    ):
        fleet = Fleet(parse_policy(one_pool([url])))
        (replica,) = fleet.pools["small"].replicas.values()
        replica.healthy = True
        await ReplicaMonitor(lambda: fleet, session, PROBES).scrape_once()
    assert replica.engine.waiting == 7


async def _unused(_: web.Request) -> web.Response:
    return web.Response(status=404)


@contextlib.asynccontextmanager
async def hung_replica() -> AsyncIterator[str]:
    """A replica still loading: it accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


@contextlib.contextmanager
def refusing_addresses(n: int) -> Iterator[list[str]]:
    """Addresses whose connections are refused: ports bound, never listened on."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        yield [f"http://127.0.0.1:{port}" for port in ports]


def one_pool(urls: list[str]) -> dict[str, object]:
    return {"pools": {"small": {"model": "m", "replicas": urls}}}


async def test_a_replica_a_reload_adds_is_probed_at_once_and_used_only_once_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The rounds are a minute apart: only the probe a reload starts can find them in time.
    probes = ProbeSettings(60, 0.5, 1, 1, 60)
    async with (
        fake_replica(_unused) as kept,
        fake_replica(_unused) as ready,
        hung_replica() as loading,
        aiohttp.ClientSession() as session,
    ):
        fleets = [Fleet(parse_policy(one_pool([kept])))]
        monitor = ReplicaMonitor(lambda: fleets[-1], session, probes)
        await monitor.start()
        try:
            with caplog.at_level(logging.WARNING, logger="gateway.fleet"):
                fleets.append(Fleet(parse_policy(one_pool([kept, ready, loading])), fleets[-1]))
                pool = fleets[-1].pools["small"]
                names = {url: url.removeprefix("http://") for url in (kept, ready, loading)}
                assert [r.name for r in pool.routable()] == [names[kept]]

                def ready_is_routable() -> bool:
                    return names[ready] in {r.name for r in pool.routable()}

                assert await eventually(ready_is_routable, within_s=5)

                def loading_timed_out() -> bool:
                    return pool.replicas[names[loading]].probed

                assert await eventually(loading_timed_out, within_s=5)
                assert [r.name for r in pool.routable()] == [names[kept], names[ready]]
        finally:
            await monitor.stop()
    health = [r.getMessage() for r in caplog.records if r.getMessage().startswith("replica ")]
    assert sorted(health) == sorted(
        [
            f"replica {names[loading]} of pool small is now unhealthy",
            f"replica {names[ready]} of pool small is now healthy",
        ]
    )


async def test_a_refused_connection_takes_a_replica_out_with_one_line_worded_as_a_probes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with refusing_addresses(2) as (first, second):
        fleet = Fleet(parse_policy(one_pool([first, second])))
        refused, probed = fleet.pools["small"].replicas.values()
        for replica in (refused, probed):
            replica.record_probe(True, unhealthy_after=1, healthy_after=1)
        async with aiohttp.ClientSession() as session:
            monitor = ReplicaMonitor(lambda: fleet, session, PROBES)
            with caplog.at_level(logging.WARNING, logger="gateway.fleet"):
                refused.mark_down()  # a request's connection refused,
                refused.mark_down()  # then the next one's, sent before the first failed
                await monitor.check_health_once()  # which finds the other one down too

    assert [r.getMessage() for r in caplog.records] == [
        f"replica {refused.name} of pool small is now unhealthy",
        f"replica {probed.name} of pool small is now unhealthy",
    ]


@pytest.mark.parametrize("found_by", ["a probe", "a refused connection"])
async def test_a_replica_gone_unhealthy_shows_no_load_figures_but_keeps_its_counters(
    found_by: str,
) -> None:
    # A pod scaled away never comes back to say so: its last queue and KV use are no one's now.
    # Its counters stay, which tell an engine restarted at its address from the same one.
    with refusing_addresses(1) as [gone]:
        fleet = Fleet(parse_policy(one_pool([gone])))
        [replica] = fleet.pools["small"].replicas.values()
        replica.record_probe(True, unhealthy_after=1, healthy_after=1)
        replica.engine = EngineStats(running=3.0, waiting=5.0, kv_usage=0.9, prefix_lookups=7e5)
        if found_by == "a refused connection":
            replica.mark_down()  # a request's; the probes after it find it down already
        async with aiohttp.ClientSession() as session:
            monitor = ReplicaMonitor(lambda: fleet, session, ProbeSettings(1, 0.5, 1, 1, 1))
            await monitor.check_health_once()
    assert not replica.healthy
    assert replica.engine == EngineStats(prefix_lookups=7e5)
