"""What the gateway knows of each pool, and the bookkeeping done at dispatch and at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gateway.fleet.autoscale import PoolAutoscale
from gateway.fleet.pool_counts import PoolCounts, UsageLearning
from gateway.fleet.pool_queue import PoolQueue, PoolSaturated, Ticket
from gateway.fleet.replicas import Dispatch, EngineStats, ReplicaState
from router_policies.cost.ttft import IDLE, full_batch, queued_tokens
from router_policies.decision import Candidate, Decision, PoolSnapshot, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.policies import Need, SelectionPolicy, make_policy
from router_policies.schema import Policy, PoolPolicy
from router_policies.tier_router import TierRouter
from router_policies.tiers import PoolLoad

if TYPE_CHECKING:
    from gateway.shared_state.outbox import Outbox

# Replica state lives in gateway/fleet/replicas.py; the pool hands its types out too.
__all__ = ["Dispatch", "EngineStats", "Fleet", "PoolSaturated", "PoolState", "ReplicaState"]

_RECHECK_S = 0.25
"""A waiting request re-checks at least this often: replicas also free up by turning healthy."""
_SERVICE_WEIGHT = 0.1
"""Weight of each finished request in a replica's mean time per request (~last 10)."""


class PoolState:
    """A pool's replicas and the dispatch bookkeeping the routing decision reads. Built anew on
    every policy reload; replica state (health, in-flight counts, learned rates), the policy's
    own state (the prefix index) and the waiting queue carry over from the previous generation,
    so a reload neither forgets caches nor strands requests in flight."""

    def __init__(self, name: str, policy: PoolPolicy, previous: PoolState | None = None) -> None:
        self.name = name
        self.policy = policy
        # What a reload carries over, one object per concern (the prefix index inside the
        # router, the autoscaler's meters inside autoscale).
        if previous is None:
            old: dict[str, ReplicaState] = {}
            self.counts = PoolCounts()
            self.learned = UsageLearning(policy.prefix.chars_per_token)
            self.queue = PoolQueue()
        else:
            old = previous.replicas
            self.counts = previous.counts
            self.learned = previous.learned
            self.queue = previous.queue
        self.replicas: dict[str, ReplicaState] = {}
        for url in policy.replicas:
            kept = next((r for r in old.values() if r.url == url), None)
            replica = kept or ReplicaState.for_pool(url, policy, name)
            self.replicas[replica.name] = replica
        self.events_on = any(policy.events_endpoint(url) for url in policy.replicas)
        """Some replica publishes KV-cache events the policy reads: requests get token keys."""
        self.router: SelectionPolicy = make_policy(
            policy, previous.router if previous is not None else None
        )
        for gone in old.keys() - self.replicas.keys():
            self.router.forget(gone)
        self._needs = self.router.needs
        self.autoscale: PoolAutoscale = PoolAutoscale(
            policy.autoscale, previous.autoscale if previous is not None else None
        )
        """The autoscaling signal and its meters (gateway/fleet/autoscale.py)."""
        self.outbox: Outbox | None = None
        """Where dispatches go to be shared with other instances (Fleet.attach; None: nothing
        shared)."""
        self.successor: PoolState | None = None
        """The generation a reload put in its place (Fleet), where requests still waiting for
        a slot of this one are dispatched."""

    @property
    def model(self) -> str:
        return self.policy.model

    @property
    def gateway_waiting(self) -> int:
        return len(self.queue)

    def healthy(self) -> list[ReplicaState]:
        """Passing health checks, ejected or not: the replicas that exist for the autoscaler."""
        return [r for r in self.replicas.values() if r.healthy]

    def routable(self, now: float | None = None) -> list[ReplicaState]:
        """Replicas a request can go to now: healthy and not ejected (/ready, overflow)."""
        now = time.monotonic() if now is None else now
        return [r for r in self.replicas.values() if r.available(now)]

    def has_slot(self, replica: ReplicaState) -> bool:
        """Below the pool's `max_inflight_per_replica`, if it has one."""
        limit = self.policy.max_inflight_per_replica
        return limit is None or replica.inflight + replica.remote_inflight < limit

    def snapshot(
        self,
        exclude: Iterable[str] = (),
        now: float | None = None,
        features: RequestFeatures | None = None,
    ) -> PoolSnapshot:
        """The candidates as the policy needs to see them (nothing it does not read); with
        the request's token keys, what each engine's events say it holds of it."""
        skip = set(exclude)
        now = time.monotonic() if now is None else now
        with_load = Need.LOAD in self._needs
        with_rates = Need.RATES in self._needs
        # Without token keys (a unique prompt, or /tokenize failed) the estimate stands.
        tokenized = features if features is not None and features.token_keys else None
        candidates = tuple(
            Candidate(
                r.name,
                r.inflight + r.remote_inflight,
                r.load() if with_load else IDLE,
                r.learner.rates() if with_rates else None,
                r.recent.value(now) if with_load else 0.0,
                self._held_bytes(r, tokenized, now) if tokenized is not None else None,
            )
            for r in self.replicas.values()
            if r.available(now) and r.name not in skip and self.has_slot(r)
        )
        return PoolSnapshot(candidates, self.counts.dispatched, now, self.learned.chars_per_token)

    def _held_bytes(
        self, replica: ReplicaState, features: RequestFeatures, now: float
    ) -> int | None:
        events = replica.exact_events(now)
        if events is None:
            return None
        estimated = self.router.estimated_cached_bytes(replica.name, features)
        return events.held_bytes(features, self.policy.prefix.layout, estimated)

    def decide(
        self, features: RequestFeatures, exclude: Iterable[str] = (), *, explain: bool = False
    ) -> Decision | None:
        snapshot = self.snapshot(exclude, features=features)
        return self.router.select(features, snapshot, explain=explain)

    def free_slot(self) -> bool:
        """Whether a replica has a slot free: a request leaving the line sees if the next one
        in it should look (one only it could not take, or one more than it took)."""
        now = time.monotonic()
        return any(r.available(now) and self.has_slot(r) for r in self.replicas.values())

    async def acquire(
        self, features: RequestFeatures, exclude: Iterable[str] = (), *, retry: bool = False
    ) -> Dispatch | None:
        """A dispatched attempt; waits in line while every replica is full. None when no
        healthy replica is left to try; PoolSaturated when the wait times out, or at once for a
        sheddable request (priority below 0). A request still waiting when the policy is
        reloaded goes to the pool's new generation (its replicas, added or removed); when the
        reload removed the pool, PoolSaturated (``removed``) at once."""
        skip = set(exclude)
        deadline = time.monotonic() + self.policy.queue_timeout_s
        priority = features.priority
        queue = self.queue
        # Newcomers queue behind those already waiting (of their priority or higher) rather
        # than jump the line.
        if not queue.ahead_of(priority):
            pool = self if self.successor is None else self.latest()
            decision = pool.decide(features, skip)
            if decision is not None:
                return pool.begin(decision, features, retry=retry)
        ticket: Ticket | None = None
        dispatch: Dispatch | None = None
        try:
            while True:
                if queue.closed:  # a reload removed the pool: no generation serves it now
                    raise PoolSaturated(self.name, removed=self.model)
                pool = self.latest()
                now = time.monotonic()
                if not any(r.available(now) and r.name not in skip for r in pool.replicas.values()):
                    return None
                remaining = deadline - now
                if priority < 0 or remaining <= 0:
                    raise PoolSaturated(self.name, shed=priority < 0)
                if ticket is None:
                    ticket = queue.join(priority)
                offered = await queue.wait(ticket, min(remaining, _RECHECK_S))
                if queue.closed or (not offered and not queue.first(ticket)):
                    continue  # its own recheck, with others still ahead of it
                pool = self.latest()
                decision = pool.decide(features, skip)
                if decision is not None:
                    dispatch = pool.begin(decision, features, retry=retry)
                    return dispatch
                if pool.free_slot():  # one it may not take (a retry's): the next in line may
                    queue.wake_one(after=ticket)
        finally:
            if ticket is not None:
                # Offered a slot it never looked at (its client left), or one more is free.
                pass_on = ticket.offered if dispatch is None else self.latest().free_slot()
                queue.leave(ticket, pass_on=pass_on)

    def latest(self) -> PoolState:
        """This pool's newest generation (itself, unless a reload replaced it)."""
        pool = self
        while pool.successor is not None:
            pool = pool.successor
        return pool

    def begin(
        self,
        decision: Decision,
        features: RequestFeatures,
        *,
        retry: bool = False,
        now: float | None = None,
    ) -> Dispatch:
        """Book the dispatch. A retry does not advance round-robin's cursor: the request's
        turn was already taken by its first attempt. ``now``: monotonic time (a simulation's
        clock; default the real one)."""
        now = time.monotonic() if now is None else now
        replica = self.replicas[decision.replica]
        load = replica.load()
        ahead = queued_tokens(load, features.hashed_bytes / self.learned.chars_per_token)
        dispatch = Dispatch(replica, decision, features, ahead, load.running, now, load.requests)
        if self.events_on:
            # Both predictions, for the error metric: what the events are worth, measured.
            estimated = self.router.estimated_cached_bytes(replica.name, features)
            dispatch.estimated_cached = estimated / self.learned.chars_per_token
            if replica.kv_events is not None:
                dispatch.exact_cached = replica.kv_events.dispatched(features, now)
        replica.inflight += 1
        replica.pending_requests += 1
        replica.pending_prefill_tokens += decision.uncached_tokens
        replica.recent.add(now)
        if not retry:
            self.counts.dispatched += 1
        dispatch.recorded = self.router.record(features, decision, now)
        if self.outbox is not None:
            self.outbox.dispatched(self.name, decision.replica, features)
        return dispatch

    def apply_remote_dispatch(self, replica: str, features: RequestFeatures, at: float) -> None:
        """Another gateway instance dispatched this request to ``replica`` at ``at``: learn it
        as if it were our own dispatch (the prefix index, the recent counts), but it is not
        in flight here (its instance's counts say so)."""
        state = self.replicas.get(replica)
        if state is None:
            return
        # Weighted by its age: a decayed count adds a past event at full weight otherwise
        # (dispatches kept through a Redis outage arrive seconds late).
        now = time.monotonic()
        age = max(now - at, 0.0)
        state.recent.add(now, 0.5 ** (age / self.policy.load.recent_half_life_s))
        self.router.record(features, Decision(replica, Route.PREFIX_HIT), min(at, now))

    def first_byte(self, dispatch: Dispatch, ttft_s: float) -> None:
        """The replica started streaming: its prefill is done."""
        if dispatch.pending:
            dispatch.settle()
            dispatch.ttft_s = ttft_s

    def end(self, dispatch: Dispatch, now: float | None = None) -> None:
        if dispatch.pending:
            dispatch.settle()
        replica = dispatch.replica
        replica.inflight -= 1
        self.counts.completions += 1
        # The time it held a batch slot: from its first token when streamed (the wait before
        # it was the queue, and counting it would make a queue look like slow service, which
        # the slot wait would then count twice); the whole stay otherwise.
        now = time.monotonic() if now is None else now
        held = now - dispatch.at - (dispatch.ttft_s or 0.0)
        replica.service_s += _SERVICE_WEIGHT * (held - replica.service_s)
        self.queue.wake_one()
        own = dispatch.prefilled_tokens  # a refused request's: none, no blocks' events due
        if dispatch.rejected and dispatch.recorded is not None:
            self.router.refused(replica.name, dispatch.request, dispatch.recorded)
        if replica.kv_events is not None:
            replica.kv_events.ended(dispatch.request, own, dispatch.at, now)
        # Streamed, its decode time tells its output length (capacity estimate).
        self.autoscale.workload.observe(
            own, held if dispatch.ttft_s is not None else None, dispatch.running
        )
        learn = self.policy.cost.learn and not full_batch(dispatch.requests, replica.slots.value)
        if dispatch.ttft_s is not None and learn:
            replica.learner.observe(dispatch.queued_tokens + own, dispatch.running, dispatch.ttft_s)

    def apply_engine_stats(self, replica: ReplicaState, stats: EngineStats) -> None:
        if replica.engine.restarted(stats):  # a new process on the address: its cache is empty
            self.router.forget(replica.name)
            replica.new_process()
        replica.engine = stats
        replica.started_since_scrape = 0
        replica.slots.observe(stats.running, stats.waiting)
        if stats.kv_capacity_tokens:
            held: int | None = stats.kv_capacity_tokens
            if replica.kv_events is not None:
                held = replica.kv_events.capacity_tokens(stats.kv_capacity_tokens)
            if held is None:
                blocks = float(self.policy.prefix.index_blocks)  # as before any size was known
            else:
                tokens = held * replica.index_belief.value
                blocks = tokens * self.learned.chars_per_token / self.policy.prefix.block_bytes
            self.router.size_index(replica.name, int(blocks))

    def engine_waiting(self) -> float:
        return sum(r.engine.waiting for r in self.replicas.values() if r.healthy)

    def mean_kv_usage(self) -> float:
        healthy = self.healthy()
        return sum(r.engine.kv_usage for r in healthy) / len(healthy) if healthy else 0.0

    def queue_depth(self) -> float:
        """Requests waiting for the pool: in every gateway instance, and in the engines."""
        return self.gateway_waiting + self.counts.remote.waiting + self.engine_waiting()

    def update_desired(self, now: float) -> None:
        """Called once per scrape round, so the stabilisation window counts real time."""
        remote = self.counts.remote
        self.autoscale.update(
            now,
            self.healthy(),
            len(self.routable(now)),
            self.queue_depth(),
            self.mean_kv_usage(),
            self.counts.arrivals + remote.arrivals,
            self.counts.completions + remote.completions,
        )

    def load(self, backlog: bool = False) -> PoolLoad:
        """Counting the routable replicas (none: saturated, so a tier overflows from it), an
        ejected one's queue moot. ``backlog``: also whether every one has a first token
        pending, which only a tier's overflow by prediction reads (else skipped)."""
        ready = self.routable()
        pending = backlog and all(r.pending_requests + r.remote_pending_requests for r in ready)
        # Every instance's waiting, as the signal counts it: one's alone overflows at N x.
        waiting = self.gateway_waiting + self.counts.remote.waiting
        return PoolLoad(
            len(ready),
            waiting + sum(r.engine.waiting for r in ready),
            self.policy.saturation_queue_per_replica,
            bool(ready) and pending,
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
        self.outbox: Outbox | None = None
        self.probe_now: Callable[[list[tuple[PoolState, ReplicaState]]], None] | None = None
        """Probes the replicas a reload adds, at once (the monitor's; reloads keep it)."""
        if previous is not None:
            if previous.outbox is not None:
                self.attach(previous.outbox)
            self.probe_now = previous.probe_now
            # Last, once nothing can fail: a reload refused midway leaves no trace.
            for name, old in previous.pools.items():
                successor = self.pools.get(name)
                if successor is None:
                    old.queue.close()  # its waiters are answered; those in flight finish
                else:
                    old.successor = successor
            # A replica kept takes the new settings; one new to its pool waits for a probe, as all
            # do at start-up (one still loading would hold requests to the first-byte timeout),
            # another pool's verdict standing in.
            kept = {r for _, r in previous.replicas()}
            known = {r.url: r.healthy for r in kept if r.probed}
            added = [(pool, r) for pool, r in self.replicas() if r not in kept]
            for pool, replica in self.replicas():
                if replica in kept:
                    replica.follow(pool.policy, time.monotonic())
                else:
                    replica.healthy = known.get(replica.url, False)
            if added and self.probe_now is not None:
                self.probe_now(added)

    def attach(self, outbox: Outbox) -> None:
        """Share this fleet's dispatches with other instances (a reload's fleet inherits it)."""
        self.outbox = outbox
        for pool in self.pools.values():
            pool.outbox = outbox

    def pool_for_model(self, model: str) -> PoolState | None:
        return self._by_model.get(model)

    def models(self) -> list[str]:
        return [*self._by_model, *self.tiers]

    def replicas(self) -> Iterable[tuple[PoolState, ReplicaState]]:
        for pool in self.pools.values():
            for replica in pool.replicas.values():
                yield pool, replica
