"""What the gateway knows of each replica and pool, and the bookkeeping done at dispatch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from router_policies.decision import Candidate, Decision, PoolSnapshot
from router_policies.fingerprint import RequestFeatures
from router_policies.policies import REGISTRY
from router_policies.prefix_index import PrefixIndex
from router_policies.schema import Policy, PoolPolicy


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


class PoolState:
    """A pool's replicas and the dispatch bookkeeping the routing decision reads."""

    def __init__(self, name: str, policy: PoolPolicy) -> None:
        self.name = name
        self.policy = policy
        self.replicas: dict[str, ReplicaState] = {}
        for url in policy.replicas:
            replica = ReplicaState(url, PrefixIndex(policy.prefix.index_blocks))
            self.replicas[replica.name] = replica
        self.dispatched = 0
        self.gateway_waiting = 0
        """Requests held in the gateway before dispatch (none yet: no per-replica limits)."""
        self.selector = REGISTRY[policy.policy]

    @property
    def model(self) -> str:
        return self.policy.model

    def healthy(self) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.healthy]

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
            if r.healthy and r.name not in skip
        )
        return PoolSnapshot(candidates, self.dispatched)

    def decide(self, features: RequestFeatures, exclude: Iterable[str] = ()) -> Decision | None:
        return self.selector.select(features, self.snapshot(features, exclude), self.policy)

    def begin(self, decision: Decision, features: RequestFeatures) -> ReplicaState:
        replica = self.replicas[decision.replica]
        replica.inflight += 1
        self.dispatched += 1
        if self.selector.uses_prefix:
            replica.index.insert(features.block_hashes)
        return replica

    @staticmethod
    def end(replica: ReplicaState) -> None:
        replica.inflight -= 1

    def engine_waiting(self) -> float:
        return sum(r.engine.waiting for r in self.replicas.values() if r.healthy)


class Fleet:
    """All pools of the current policy, found by name or by the model clients ask for."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.pools = {name: PoolState(name, p) for name, p in policy.pools.items()}
        self._by_model = {p.model: p for p in self.pools.values()}

    def pool_for_model(self, model: str) -> PoolState | None:
        return self._by_model.get(model)

    def models(self) -> list[str]:
        return list(self._by_model)

    def replicas(self) -> Iterable[tuple[PoolState, ReplicaState]]:
        for pool in self.pools.values():
            for replica in pool.replicas.values():
                yield pool, replica
