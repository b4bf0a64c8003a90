"""What the gateway knows of one replica: health, engine figures, learned speed and load, and
the record of one dispatch there. Plain state, updated by the pool (gateway/fleet/pools.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from gateway.fleet.kv_event_stream import EventStream
from router_policies.batch_slots import BatchSlots
from router_policies.cost.rates import RateLearner, default_rates
from router_policies.cost.ttft import ReplicaLoad
from router_policies.decay import DecayedCount
from router_policies.decision import Decision
from router_policies.fingerprint import RequestFeatures
from router_policies.index_belief import IndexBelief
from router_policies.prefix_index import Recorded
from router_policies.schema import PoolPolicy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outlier:
    """One replica's passive-health record (carried over policy reloads with its replica)."""

    consecutive_failures: int = 0
    ejections: int = 0
    """Ejections since the replica last answered well: the backoff's exponent."""
    ejected_until: float = 0.0
    """Monotonic time the current ejection ends (0: never ejected)."""

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until


@dataclass(slots=True)
class EngineStats:
    """Figures scraped from a replica's own /metrics."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    kv_capacity_tokens: int | None = None
    prefix_lookups: float | None = None
    """Prompt tokens the engine has looked up in its prefix cache since it started (a counter:
    vllm:prefix_cache_queries_total); None where it does not say."""

    def restarted(self, later: EngineStats) -> bool:
        """Whether ``later``, scraped after these, is another process's: a counter went back.
        A replica restarted on its address (a crashed container's) has an empty cache, which
        the index would otherwise claim until its first KV event or its eviction."""
        last, now = self.prefix_lookups, later.prefix_lookups
        return last is not None and now is not None and now < last


@dataclass(slots=True, eq=False)
class ReplicaState:
    url: str
    learner: RateLearner
    recent: DecayedCount
    """Requests dispatched here lately: the balance rule's measure."""
    index_belief: IndexBelief = field(default_factory=IndexBelief)
    """Share of the prefix index's claims about this replica that its reports bear out."""
    reports_cached: bool = False
    """Whether its usage has carried `prompt_tokens_details.cached_tokens`: it runs with
    --enable-prompt-tokens-details, and a usage without them is a miss (vLLM leaves the field
    out when it is 0, in the versions that test it for truth)."""
    slots: BatchSlots = field(default_factory=BatchSlots)
    """The engine's batch size, as far as its queue has shown it."""
    service_s: float = 0.0
    """Recent mean time a request stays here (dispatch to end)."""
    name: str = ""
    pool: str = ""
    """The pool it serves, for the log lines about it."""
    healthy: bool = True
    """Routable as far as health goes. True before the first probe only in the start-up fleet,
    which serves once that probe is done; a reload's new replicas wait for theirs (Fleet)."""
    inflight: int = 0
    """Requests this gateway has dispatched and not yet finished: counted at dispatch, so a
    burst sees its own effect before the next scrape."""
    remote_inflight: int = 0
    """Requests the other gateway instances have in flight here (shared state; else 0)."""
    remote_pending_requests: int = 0
    remote_pending_prefill_tokens: float = 0.0
    """The other instances' requests here without a first byte yet, and their uncached
    prompt tokens: the prefill queued ahead, as one gateway would see it."""
    pending_requests: int = 0
    pending_prefill_tokens: float = 0.0
    """Uncached prompt tokens of this gateway's requests here that have no first byte yet."""
    engine: EngineStats = field(default_factory=EngineStats)
    started_since_scrape: int = 0
    """This gateway's requests here that left the engine's queue (first byte) since the last
    scrape: the scraped waiting count still holds them, and counting them as someone else's
    queued prefill would make a replica that just caught up look busy."""
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    probed: bool = False
    outlier: Outlier = field(default_factory=Outlier)
    """Passive health from real requests (gateway/fleet/outlier.py)."""
    kv_events: EventStream | None = None
    """Its KV-cache event stream, where it publishes one and the policy reads it."""
    adapters: frozenset[str] = frozenset()
    """The LoRA adapters its own /v1/models listed when it last answered
    (gateway/fleet/adapter_discovery.py): vLLM answers 404 for an adapter it does not serve, so
    routing sends an adapter only where it is listed (gateway/routing/resolve.py)."""

    def __post_init__(self) -> None:
        self.name = self.name or urlsplit(self.url).netloc

    @classmethod
    def for_pool(cls, url: str, policy: PoolPolicy, pool: str = "") -> ReplicaState:
        """A replica new to the gateway: the pool's default rates until it learns its own."""
        cost = policy.cost
        learner = RateLearner(
            default_rates(policy.cost), forgetting=cost.forgetting, min_samples=cost.min_samples
        )
        return cls(url, learner, DecayedCount(policy.load.recent_half_life_s), pool=pool)

    def follow(self, policy: PoolPolicy, now: float) -> None:
        """This replica kept by a reload: the new policy's rates where it uses the policy's
        (learning off, or its own not learned yet), forgetting and recent-load half-life."""
        cost = policy.cost
        self.learner.retune(
            default_rates(cost), forgetting=cost.forgetting, min_samples=cost.min_samples,
            learn=cost.learn,
        )  # fmt: skip
        self.recent.retune(policy.load.recent_half_life_s, now)

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

    def available(self, now: float) -> bool:
        """Routable: passes health checks and is not ejected for failing requests."""
        return self.healthy and not self.outlier.ejected(now)

    def exact_events(self, now: float) -> EventStream | None:
        """Its event stream, while routing can trust it."""
        events = self.kv_events
        return events if events is not None and events.exact(now) else None

    def new_process(self) -> None:
        """Another process answers on its address (its counters went back): what its engine
        held and how it was started (its batch size, whether its usage reports cached
        tokens, perhaps changed with an upgrade) is known again only from what it shows."""
        if self.kv_events is not None:
            self.kv_events.blocks.clear()
        self.reports_cached = False
        self.slots = BatchSlots()

    def mark_down(self) -> None:
        """A refused connection is proof enough: stop sending here until probes succeed again."""
        was = self.healthy
        self.healthy = False
        self.consecutive_successes = 0
        if was:  # once: every request still on its way here is refused too
            log_health(self, self.pool)
            self.forget_load()

    def forget_load(self) -> None:
        """Its last load figures are no longer its state (it went down; a pod scaled away never
        comes back to say so): 0 until a scrape reads it again. Its counters stay, which tell
        a restarted engine from the same one."""
        self.engine = replace(self.engine, running=0.0, waiting=0.0, kv_usage=0.0)

    def load(self) -> ReplicaLoad:
        inflight = float(self.inflight + self.remote_inflight)
        waiting = max(self.engine.waiting - self.started_since_scrape, 0.0)
        requests = max(self.engine.running + waiting, inflight)
        return ReplicaLoad(
            self.pending_prefill_tokens + self.remote_pending_prefill_tokens,
            self.pending_requests + self.remote_pending_requests,
            min(max(self.engine.running, inflight), self.slots.value),
            waiting,
            requests,
            self.slots.value,
            self.service_s,
        )


def log_health(replica: ReplicaState, pool: str) -> None:
    """The line each change of a replica's health gets, whether a probe or a refused connection
    found it: an operator reads both directions in one wording."""
    state = "healthy" if replica.healthy else "unhealthy"
    log.warning("replica %s of pool %s is now %s", replica.name, pool, state)


@dataclass(slots=True, eq=False)
class Dispatch:
    """One attempt of a request on one replica, from dispatch to its end."""

    replica: ReplicaState
    decision: Decision
    request: RequestFeatures
    queued_tokens: float
    """Prefill tokens queued ahead of the request there at dispatch."""
    running: float
    """Sequences in the replica's batch at dispatch."""
    at: float
    """Monotonic time of the dispatch."""
    requests: float
    """Requests running or waiting there at dispatch (did it wait for a batch slot?)."""
    pending: bool = True
    """Its own uncached tokens still count in the replica's pending prefill."""
    ttft_s: float | None = None
    """Dispatch to the replica's first byte, once streamed."""
    uncached_tokens: float | None = None
    """Prompt tokens the replica really prefilled, once its usage says (else the prediction)."""
    exact_cached: int | None = None
    """Prompt tokens its KV-cache events said the replica holds (None: not known exactly)."""
    estimated_cached: float | None = None
    """Prompt tokens the estimate said it holds (None: the policy keeps no index)."""
    refused: bool = False
    """The replica answered 4xx: it judged the request invalid before any prefill."""
    rejected: bool = False
    """Refused with a 4xx status, not an error event in a stream: vLLM checks a request (its
    length, its parameters) before its engine sees any of it, so nothing of it was stored."""
    recorded: Recorded | None = None
    """What the policy's index recorded of it there (taken back when it was rejected)."""

    @property
    def prefilled_tokens(self) -> float:
        """Prompt tokens the replica prefilled: none when it refused the request, else what its
        usage said (else the prediction)."""
        if self.refused:
            return 0.0
        own = self.uncached_tokens
        return self.decision.uncached_tokens if own is None else own

    def settle(self) -> None:
        """Its prefill is over (first byte, or the end): off the replica's pending counts."""
        self.pending = False
        replica = self.replica
        replica.pending_requests -= 1
        replica.started_since_scrape += 1
        replica.pending_prefill_tokens = max(
            replica.pending_prefill_tokens - self.decision.uncached_tokens, 0.0
        )
