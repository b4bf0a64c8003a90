"""What the gateway knows of each replica and pool, and the bookkeeping done at dispatch."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from router_policies.autoscale import RateMeter, ScaleDownStabilizer, desired_replicas
from router_policies.decision import Candidate, Decision, PoolSnapshot
from router_policies.fingerprint import RequestFeatures
from router_policies.policies import REGISTRY
from router_policies.prefix_index import PrefixIndex
from router_policies.schema import Policy, PoolPolicy
from router_policies.tier_router import TierRouter
from router_policies.tiers import PoolLoad

_RECHECK_S = 0.25
"""A waiting request re-checks at least this often: replicas also free up by turning healthy."""


@dataclass(slots=True)
class EngineStats:
    """Figures scraped from a replica's own /metrics."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    kv_capacity_tokens: int | None = None


@dataclass(slots=True, eq=False)
class ReplicaState:
    url: str
    index: PrefixIndex
    name: str = ""
    healthy: bool = True
    inflight: int = 0
    """Requests this gateway has dispatched and not yet finished: counted at dispatch, so a
    burst sees its own effect before the next scrape."""
    engine: EngineStats = field(default_factory=EngineStats)
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    probed: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or urlsplit(self.url).netloc

    @property
    def load(self) -> float:
        return self.inflight + self.engine.waiting

    def record_probe(self, ok: bool, unhealthy_after: int, healthy_after: int) -> None:
        if not self.probed:
            # The first probe has no history to smooth over: it is the truth.
            self.probed = True
            self.healthy = ok
        if ok:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            if not self.healthy and self.consecutive_successes >= healthy_after:
                self.healthy = True
        else:
            self.consecutive_successes = 0
            self.consecutive_failures += 1
            if self.healthy and self.consecutive_failures >= unhealthy_after:
                self.healthy = False

    def mark_down(self) -> None:
        """A refused connection is proof enough: stop sending here until probes succeed again."""
        self.healthy = False
        self.consecutive_successes = 0

    def apply_engine_stats(self, stats: EngineStats, policy: PoolPolicy) -> None:
        self.engine = stats
        if stats.kv_capacity_tokens:
            prefix = policy.prefix
            blocks = stats.kv_capacity_tokens * prefix.chars_per_token / prefix.block_bytes
            self.index.resize(int(blocks))


class PoolSaturated(Exception):
    """No replica slot freed up within the pool's queue timeout."""


class PoolQueue:
    """Requests waiting in the gateway for a replica slot, first come first served."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout_s: float) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class PoolState:
    """A pool's replicas and the dispatch bookkeeping the routing decision reads.

    Built anew on every policy reload; replica state (health, in-flight counts, prefix
    indexes) and the waiting queue carry over from the previous generation, so a reload
    neither forgets caches nor strands the requests in flight or in line.
    """

    def __init__(self, name: str, policy: PoolPolicy, previous: PoolState | None = None) -> None:
        self.name = name
        self.policy = policy
        old = previous.replicas if previous is not None else {}
        same_fingerprint = previous is not None and previous.policy.prefix == policy.prefix
        self.replicas: dict[str, ReplicaState] = {}
        for url in policy.replicas:
            replica = next((r for r in old.values() if r.url == url), None)
            if replica is None:
                replica = ReplicaState(url, PrefixIndex(policy.prefix.index_blocks))
            elif not same_fingerprint:
                replica.index.clear()  # digests of the old block size match nothing now
            self.replicas[replica.name] = replica
        self.dispatched: int = previous.dispatched if previous is not None else 0
        self.queue: PoolQueue = previous.queue if previous is not None else PoolQueue()
        self.selector = REGISTRY[policy.policy]
        window = policy.autoscale.scale_down_stabilization_s
        keep_history = previous is not None and previous.stabilizer.window_s == window
        self.stabilizer: ScaleDownStabilizer = (
            previous.stabilizer
            if previous is not None and keep_history
            else ScaleDownStabilizer(window)
        )
        self.raw_desired: int = (
            previous.raw_desired if previous is not None else policy.autoscale.min_replicas
        )
        self.desired: int = previous.desired if previous is not None else self.raw_desired
        self.arrivals: int = previous.arrivals if previous is not None else 0
        """Requests routed to this pool, counted on arrival: demand, not throughput."""
        self.arrival_meter: RateMeter = (
            previous.arrival_meter
            if previous is not None
            and previous.arrival_meter.window_s == policy.autoscale.rate_window_s
            else RateMeter(policy.autoscale.rate_window_s)
        )
        self.arrival_rate: float = previous.arrival_rate if previous is not None else 0.0

    @property
    def model(self) -> str:
        return self.policy.model

    @property
    def gateway_waiting(self) -> int:
        return len(self.queue)

    def healthy(self) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.healthy]

    def _has_slot(self, replica: ReplicaState) -> bool:
        limit = self.policy.max_inflight_per_replica
        return limit is None or replica.inflight < limit

    def snapshot(self, features: RequestFeatures, exclude: Iterable[str] = ()) -> PoolSnapshot:
        skip = set(exclude)
        with_prefix = self.selector.uses_prefix
        candidates = tuple(
            Candidate(
                r.name,
                r.load,
                r.index.match_length(features.block_hashes) if with_prefix else 0,
            )
            for r in self.replicas.values()
            if r.healthy and r.name not in skip and self._has_slot(r)
        )
        return PoolSnapshot(candidates, self.dispatched)

    def decide(self, features: RequestFeatures, exclude: Iterable[str] = ()) -> Decision | None:
        return self.selector.select(features, self.snapshot(features, exclude), self.policy)

    async def acquire(
        self, features: RequestFeatures, exclude: Iterable[str] = ()
    ) -> tuple[Decision, ReplicaState] | None:
        """A decision and its dispatched replica; waits in line while every replica is full.

        None when no healthy replica is left to try; PoolSaturated when the wait times out.
        """
        skip = set(exclude)
        deadline = time.monotonic() + self.policy.queue_timeout_s
        # Newcomers queue behind those already waiting rather than jump the line.
        if not len(self.queue):
            decision = self.decide(features, skip)
            if decision is not None:
                return decision, self.begin(decision, features)
        while True:
            if not any(r.healthy and r.name not in skip for r in self.replicas.values()):
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PoolSaturated(self.name)
            await self.queue.wait(min(remaining, _RECHECK_S))
            decision = self.decide(features, skip)
            if decision is not None:
                return decision, self.begin(decision, features)

    def begin(self, decision: Decision, features: RequestFeatures) -> ReplicaState:
        replica = self.replicas[decision.replica]
        replica.inflight += 1
        self.dispatched += 1
        if self.selector.uses_prefix:
            replica.index.insert(features.block_hashes)
        return replica

    def end(self, replica: ReplicaState) -> None:
        replica.inflight -= 1
        self.queue.wake_one()

    def engine_waiting(self) -> float:
        return sum(r.engine.waiting for r in self.replicas.values() if r.healthy)

    def mean_kv_usage(self) -> float:
        healthy = self.healthy()
        return sum(r.engine.kv_usage for r in healthy) / len(healthy) if healthy else 0.0

    def update_desired(self, now: float) -> None:
        """Called once per scrape round, so the stabilisation window counts real time."""
        depth = self.gateway_waiting + self.engine_waiting()
        self.arrival_rate = self.arrival_meter.rate(now, self.arrivals)
        self.raw_desired = desired_replicas(
            len(self.healthy()),
            depth,
            self.mean_kv_usage(),
            self.policy.autoscale,
            self.arrival_rate,
        )
        self.desired = self.stabilizer.recommend(now, self.raw_desired)

    def load(self) -> PoolLoad:
        return PoolLoad(
            len(self.healthy()),
            self.gateway_waiting + self.engine_waiting(),
            self.policy.saturation_queue_per_replica,
        )


class Fleet:
    """All pools and tiers of one policy generation, found by the model clients ask for."""

    def __init__(self, policy: Policy, previous: Fleet | None = None) -> None:
        self.policy = policy
        old_pools: dict[str, PoolState] = previous.pools if previous is not None else {}
        old_tiers: dict[str, TierRouter] = previous.tiers if previous is not None else {}
        self.pools: dict[str, PoolState] = {
            name: PoolState(name, p, old_pools.get(name)) for name, p in policy.pools.items()
        }
        self.tiers: dict[str, TierRouter] = {
            model: TierRouter(model, t, old_tiers.get(model)) for model, t in policy.tiers.items()
        }
        self._by_model = {p.model: p for p in self.pools.values()}

    def pool_for_model(self, model: str) -> PoolState | None:
        return self._by_model.get(model)

    def models(self) -> list[str]:
        return [*self._by_model, *self.tiers]

    def replicas(self) -> Iterable[tuple[PoolState, ReplicaState]]:
        for pool in self.pools.values():
            for replica in pool.replicas.values():
                yield pool, replica
