"""Background probes of every replica: health checks and metric scrapes, off the request path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from gateway import headers
from gateway.background import stop_tasks
from gateway.fleet.pools import Fleet, PoolState, ReplicaState
from gateway.fleet.replicas import log_health
from gateway.fleet.scrape import parse_engine_stats

log = logging.getLogger(__name__)

ANSWER_MAX_BYTES = 8 << 20
"""Most of a replica's /metrics or model list read: vLLM's /metrics is ~100 KB (its histograms,
for one model). A longer answer is a missed read, not memory the gateway gives whatever a
replica (or the proxy in front of it) sends."""


async def read_at_most(resp: aiohttp.ClientResponse, limit: int = ANSWER_MAX_BYTES) -> bytes:
    """The answer's body; ValueError past ``limit`` bytes, read no further."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise ValueError(f"longer than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    health_interval_s: float
    health_timeout_s: float
    unhealthy_after: int
    healthy_after: int
    scrape_interval_s: float


class ReplicaMonitor:
    """Runs the health and scrape loops over whatever fleet `current()` returns each round,
    so a policy reload is picked up without restarting the loops."""

    def __init__(
        self, current: Callable[[], Fleet], session: aiohttp.ClientSession, probes: ProbeSettings
    ) -> None:
        self._current = current
        self._session = session
        self._probes = probes
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: set[asyncio.Task[None]] = set()
        """Probes of replicas a reload added, each held until it ends."""
        self._failing: set[str] = set()
        """Pools whose autoscaling update failed last round: logged once, not every round."""
        self._unread: set[tuple[str, str]] = set()
        """(pool, replica) whose last scrape could not be read: logged once, not every round."""

    async def start(self) -> None:
        # Before the first round: a reload from now on has its new replicas probed at once
        # (reloads hand this on), as the round does for the start-up fleet.
        self._current().probe_now = self.probe_now
        # One health and scrape round before serving, so /ready, routing and the autoscaling
        # signal start from the truth (an HPA reading no signal yet keeps its count).
        await self.check_health_once()
        await self.scrape_once()
        self._tasks = [
            asyncio.create_task(
                self._every(self._probes.health_interval_s, self.check_health_once),
                name="replica health checks",
            ),
            asyncio.create_task(
                self._every(self._probes.scrape_interval_s, self.scrape_once),
                name="replica metrics scrapes",
            ),
        ]

    async def stop(self) -> None:
        self._current().probe_now = None  # a reload while stopping: no probe on a closed session
        await stop_tasks([*self._tasks, *self._probing])
        self._tasks = []

    def probe_now(self, replicas: list[tuple[PoolState, ReplicaState]]) -> None:
        """Probe these (a reload's new replicas) now, not at the next round: they get no
        traffic until a probe says healthy (Fleet)."""
        task = asyncio.get_running_loop().create_task(
            self._check_these(replicas), name="new replica probes"
        )
        self._probing.add(task)
        task.add_done_callback(self._probing.discard)

    async def _check_these(self, replicas: list[tuple[PoolState, ReplicaState]]) -> None:
        try:
            await asyncio.gather(*(self._check(pool, r) for pool, r in replicas))
        except Exception:  # as in a round: the next round probes them anyway
            log.exception("replica probe round failed")

    @staticmethod
    async def _every(interval: float, round_: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await round_()
            except Exception:  # a probe bug must not kill the loop that keeps routing honest
                log.exception("replica probe round failed")

    async def check_health_once(self) -> None:
        fleet = self._current()
        await asyncio.gather(*(self._check(pool, r) for pool, r in fleet.replicas()))

    async def scrape_once(self) -> None:
        fleet = self._current()
        scraped = [(pool, r) for pool, r in fleet.replicas() if r.healthy]
        # One replica's failure must not stop the others' scrapes, nor the autoscaling signal.
        outcomes = await asyncio.gather(
            *(self._scrape(pool, r) for pool, r in scraped), return_exceptions=True
        )
        for (pool, replica), outcome in zip(scraped, outcomes, strict=True):
            if isinstance(outcome, Exception):
                self._missed(pool, replica, "failed", outcome)
        if self._unread:  # a replica gone (scaled away, removed by a reload) is no longer news
            present = {(pool.name, replica.name) for pool, replica in fleet.replicas()}
            self._unread &= present
        now = time.monotonic()
        for pool in fleet.pools.values():
            # One pool's failure must not freeze the signal of the pools after it.
            try:
                pool.update_desired(now)
            except Exception:
                if pool.name not in self._failing:
                    log.exception("autoscaling update of pool %s failed", pool.name)
                self._failing.add(pool.name)
            else:
                self._failing.discard(pool.name)

    async def _check(self, pool: PoolState, replica: ReplicaState) -> None:
        probes = self._probes
        timeout = aiohttp.ClientTimeout(total=probes.health_timeout_s)
        try:
            async with self._session.get(f"{replica.url}/health", timeout=timeout) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        was, first = replica.healthy, not replica.probed
        replica.record_probe(ok, probes.unhealthy_after, probes.healthy_after)
        # A reload's new replica starts unhealthy: its failed first probe is news all the same.
        if replica.healthy != was or (first and not ok):
            log_health(replica, pool.name)
        if was and not replica.healthy:
            replica.forget_load()

    async def _scrape(self, pool: PoolState, replica: ReplicaState) -> None:
        timeout = aiohttp.ClientTimeout(total=max(self._probes.scrape_interval_s, 0.5))
        try:
            async with self._session.get(
                f"{replica.url}/metrics", timeout=timeout, headers=headers.UNCOMPRESSED
            ) as resp:
                if resp.status != 200:  # a 401 or a 5xx: logged once, as unreadable figures
                    raise ValueError(f"HTTP {resp.status}")
                if resp.content_type == "text/html":  # a proxy's page; read, it says 0 everywhere
                    raise ValueError("an HTML page")
                text = (await read_at_most(resp)).decode()
            stats = parse_engine_stats(text, replica.engine)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Health checks decide about liveness; a missed scrape keeps the last figures.
            self._missed(pool, replica, f"could not be fetched ({exc!r:.200})")
            return
        except ValueError as exc:  # not UTF-8, not Prometheus's format: missed, as above
            self._missed(pool, replica, f"cannot be read ({exc!s:.200})")
            return
        if replica.healthy:  # gone unhealthy while the scrape ran: its figures were cleared
            pool.apply_engine_stats(replica, stats)
        self._unread.discard((pool.name, replica.name))

    def _missed(
        self, pool: PoolState, replica: ReplicaState, why: str, error: Exception | None = None
    ) -> None:
        # Kept, not zeroed: a /metrics too slow to answer is most often an engine under load,
        # whose queue the autoscaling signal must go on counting.
        if (pool.name, replica.name) in self._unread:
            return
        self._unread.add((pool.name, replica.name))
        log.warning(
            "metrics of replica %s of pool %s %s: its last figures are kept until a scrape "
            "reads them", replica.name, pool.name, why, exc_info=error,
        )  # fmt: skip
