"""The simulation loop: the gateway, Prometheus and the HPA around the simulated pods, one
strategy on one scenario's arrivals at a time."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.scaling.config import ScalingConfig, Scenario, Strategy, strategies
from bench.scaling.hpa import Hpa, HpaBehavior
from bench.scaling.model import right_replicas
from bench.scaling.pods import Pod, Timing, poisson_arrivals, tick_count
from bench.scaling.results import (
    ScalingResult,
    ScenarioOutcome,
    Series,
    StrategyOutcome,
    Summary,
    direction_changes,
    first_at_least,
    max_direction_changes,
    worst_lag,
)
from gateway.fleet.pool_queue import PoolQueue
from gateway.fleet.pools import Dispatch, EngineStats, PoolState
from router_policies.decision import Decision, Route
from router_policies.fingerprint import RequestFeatures
from router_policies.schema import PolicyName, PoolPolicy


class _SimQueue(PoolQueue):
    """The gateway's waiting line as PoolState counts it: its length is the simulator's."""

    def __init__(self, line: deque[float]) -> None:
        super().__init__()
        self._line = line

    def __len__(self) -> int:
        return len(self._line)


class _Simulation:
    """One strategy on one scenario's arrivals."""

    def __init__(
        self, config: ScalingConfig, scenario: Scenario, strategy: Strategy, arrivals: list[float]
    ) -> None:
        self.config = config
        self.scenario = scenario
        self.strategy = strategy
        self.arrivals = arrivals
        self.model = config.engine
        self.timing = Timing(config.engine)
        self.settings = settings = config.settings_for(strategy.key)
        self.line: deque[float] = deque()
        """The gateway's own waiting line (arrival times), first come first served."""
        self.pods: list[Pod] = []
        self.draining: list[Pod] = []
        self.serial = 0
        initial = right_replicas(scenario.base_rate, self.model, settings)
        for _ in range(initial):
            self._create(0.0, ready_s=0.0)
        self.pool = self._pool(None)
        # Every request is the same prompt, never cached (no prefix sharing is simulated).
        self.features = RequestFeatures(
            "sim", (), round(self.model.prompt_tokens * self.pool.learned.chars_per_token)
        )
        # The gateway has counted the base load for a rate window before t=0, as one that has
        # been up a while. (Just started, its RateMeter averages over a second or two of
        # Poisson noise and P may ask for a replica too many, held for the stabilization window.)
        window = settings.rate_window_s
        self.pool.autoscale.arrival_meter.rate(-window, 0)
        self.pool.counts.arrivals = round(scenario.base_rate * window)
        down_window = (
            config.hpa_scale_down_window_s
            if strategy.stabilized
            else config.queue_hpa_scale_down_window_s
        )
        self.hpa = Hpa(
            strategy.target,
            settings.min_replicas,
            settings.max_replicas,
            HpaBehavior(scale_down_window_s=down_window),
        )
        self.hpa_target = initial
        self.scraped = 0.0
        self.first_tokens: list[float] = []
        """(arrival, first token) time pairs, flattened."""
        self.pod_s = 0.0
        self.series = Series()

    def _create(self, now: float, ready_s: float) -> None:
        self.serial += 1
        pod = Pod(f"10.0.{self.serial // 250}.{self.serial % 250 + 1}:8000", now, ready_s)
        pod.healthy = ready_s <= now
        self.pods.append(pod)

    def _pool(self, previous: PoolState | None) -> PoolState:
        """The gateway's pool over the current pods, rebuilt as a policy reload rebuilds it."""
        policy = PoolPolicy(
            model="sim",
            replicas=[f"http://{p.name}" for p in self.pods],
            policy=PolicyName.LEAST_LOADED,
            max_inflight_per_replica=self.config.inflight_limit,
            autoscale=self.settings,
        )
        pool = PoolState("sim", policy, previous)
        if previous is None:
            pool.queue = _SimQueue(self.line)
        for pod in self.pods:
            pool.replicas[pod.name].healthy = pod.healthy
        return pool

    # -- the gateway ----------------------------------------------------------------------

    def gateway_round(self, now: float) -> None:
        """Health probes, engine scrapes and update_desired, once per gateway round."""
        if any(not p.healthy and p.ready_s <= now for p in self.pods):
            for pod in self.pods:
                pod.healthy = pod.ready_s <= now
            self.pool = self._pool(self.pool)
        model = self.model
        pool = self.pool
        for pod in self.pods:
            if pod.healthy:
                stats = EngineStats(
                    running=float(pod.running),
                    waiting=float(len(pod.waiting)),
                    kv_usage=pod.kv_usage(model),
                    kv_capacity_tokens=model.kv_capacity_tokens,
                )
                pool.apply_engine_stats(pool.replicas[pod.name], stats)
        pool.update_desired(now)

    def dispatch(self, now: float) -> None:
        """Each waiting request to the healthy replica with the fewest in flight, while one has
        room under the in-flight limit, booked with the gateway as its dispatch books it
        (``PoolState.begin``; its first token and its end go to ``first_byte`` and ``end``)."""
        line = self.line
        if not line:
            return
        open_ = [p for p in self.pods if p.healthy]
        limit = self.config.inflight_limit
        if limit is not None:
            open_ = [p for p in open_ if p.inflight < limit]
        least = attrgetter("inflight")
        pool, features = self.pool, self.features
        prompt = float(self.model.prompt_tokens)
        while line and open_:
            pod = min(open_, key=least)
            arrival = line.popleft()
            decision = Decision(pod.name, Route.LEAST_LOADED, uncached_tokens=prompt)
            booked = pool.begin(decision, features, now=now)
            pod.waiting.append((arrival, booked))
            pod.inflight += 1
            if limit is not None and pod.inflight >= limit:
                open_.remove(pod)

    def first_token(self, dispatch: Dispatch, at: float) -> None:
        self.pool.first_byte(dispatch, at - dispatch.at)

    def end(self, dispatch: Dispatch, at: float) -> None:
        # The gateway counts each request that ends: what its capacity is learned from.
        self.pool.end(dispatch, now=at)

    # -- Prometheus and the HPA -----------------------------------------------------------

    def metric(self) -> float:
        """The strategy's metric as Prometheus scrapes it now."""
        key = self.strategy.key
        if key == "B":
            return float(sum(len(p.waiting) for p in self.pods if p.healthy))
        if key == "C":
            return float(self.pool.load().queue_depth)
        desired = self.pool.autoscale.desired  # A, P: gateway_pool_desired_replicas
        return self.scraped if desired is None else float(desired)  # absent: the last sample

    def hpa_sync(self, now: float) -> None:
        target = self.hpa.sync(now, self.scraped, len(self.pods))
        self.hpa_target = target
        self.series.hpa_t.append(now)
        self.series.hpa_value.append(target)
        if target == len(self.pods):
            return
        if target > len(self.pods):
            for _ in range(target - len(self.pods)):
                self._create(now, now + self.config.cold_start_s)
        else:
            # ReplicaSet deletion order: not-ready pods before ready ones, newest first.
            order = sorted(self.pods, key=lambda p: (p.healthy, -p.created_s))
            for pod in order[: len(self.pods) - target]:
                self.pods.remove(pod)
                if pod.healthy and pod.inflight:
                    pod.healthy = False
                    pod.draining = True  # takes nothing new, finishes what it holds
                    self.draining.append(pod)
        self.pool = self._pool(self.pool)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, progress: Callable[[int], object] | None = None) -> StrategyOutcome:
        config, scenario, timing = self.config, self.scenario, self.timing
        dt = config.tick_s
        ticks = tick_count(scenario.duration_s, dt)
        round_every = tick_count(config.gateway_round_s, dt)
        scrape_every = tick_count(config.scrape_interval_s, dt)
        hpa_every = tick_count(config.hpa_sync_s, dt)
        hpa_offset = tick_count(config.hpa_phase_s, dt) % hpa_every
        arrivals, total, upcoming = self.arrivals, len(self.arrivals), 0
        derived = self.strategy.key in ("B", "C")
        series, first = self.series, self.first_tokens
        for k in range(ticks):
            now = k * dt
            while upcoming < total and arrivals[upcoming] < now:
                self.line.append(arrivals[upcoming])
                self.pool.counts.arrivals += 1  # the gateway counts each request routed to the pool
                upcoming += 1
            if k % round_every == 0:
                self.gateway_round(now)
            if k % scrape_every == 0:
                self.scraped = self.metric()
                series.scrape_t.append(now)
                series.scrape_signal.append(
                    math.ceil(self.scraped / self.strategy.target - 1e-9)
                    if derived
                    else self.scraped
                )
            if k % hpa_every == hpa_offset:
                self.hpa_sync(now)
            self.dispatch(now)
            on_first, on_end = self.first_token, self.end
            for pod in self.pods:
                if pod.inflight:
                    pod.advance(now, dt, timing, first, on_first, on_end)
            if self.draining:
                for pod in self.draining:
                    pod.advance(now, dt, timing, first, on_first, on_end)
            self.draining = [p for p in self.draining if p.inflight]
            self.pod_s += (len(self.pods) + len(self.draining)) * dt
            if k % round_every == 0:
                self._sample(now)
            if progress is not None and k % 1000 == 999:
                progress(1000)
        if progress is not None:
            progress(ticks % 1000)
        return StrategyOutcome(self.strategy, series, self._summarize(ticks * dt))

    def _sample(self, now: float) -> None:
        s, model = self.series, self.model
        healthy = [p for p in self.pods if p.healthy]
        rate = self.scenario.rate(now)
        s.t.append(now)
        s.rate.append(rate)
        s.right.append(right_replicas(rate, model, self.config.settings))
        s.ready.append(len(healthy))
        s.pods.append(len(self.pods))
        s.hpa_target.append(self.hpa_target)
        s.signal.append(s.scrape_signal[-1] if s.scrape_signal else math.nan)
        s.queue_depth.append(len(self.line) + sum(len(p.waiting) for p in healthy))
        s.gateway_waiting.append(len(self.line))
        s.kv_usage.append(
            sum(p.kv_usage(model) for p in healthy) / len(healthy) if healthy else 0.0
        )

    def _summarize(self, end: float) -> Summary:
        config, scenario, s = self.config, self.scenario, self.series
        interval, event = config.scrape_interval_s, scenario.event_s
        step = scenario.name == "step"
        right_after = right_replicas(
            scenario.base_rate * scenario.factor, self.model, config.settings
        )
        reach: float | None = math.nan
        signal_at_2 = math.nan
        if step:
            hit = first_at_least(s.scrape_t, s.scrape_signal, event, right_after)
            reach = None if hit is None else (hit - event) / interval
            after = [v for t, v in zip(s.scrape_t, s.scrape_signal, strict=True) if t >= event]
            signal_at_2 = after[min(2, len(after) - 1)] if after else math.nan
        lag = worst_lag(s.t, s.right, s.hpa_target)
        ready_at = first_at_least(s.t, s.ready, event, right_after)
        pairs = np.array(self.first_tokens, dtype=float).reshape(-1, 2)
        arrival, served = pairs[:, 0], pairs[:, 1]
        ttft = served - arrival
        self._ttft_windows(served, ttft)
        unserved = [*self.line]
        for pod in (*self.pods, *self.draining):
            unserved.extend(pod.held())
        horizon = event + (300.0 if step else 2 * scenario.rise_s)
        chosen = ttft[(arrival >= event) & (arrival < horizon)]
        waited = np.array([end - a for a in unserved if event <= a < horizon], dtype=float)
        window = np.concatenate([chosen, waited])
        round_s = config.gateway_round_s
        return Summary(
            right_after=right_after,
            reach_intervals=reach,
            signal_at_2=signal_at_2,
            lag_intervals=None if lag is None else lag / interval,
            short_s=round_s
            * sum(1 for t, r, n in zip(s.t, s.right, s.ready, strict=True) if t >= event and n < r),
            peak_signal=max(s.scrape_signal),
            peak_target=max(s.hpa_value),
            max_changes_per_window=max_direction_changes(
                s.hpa_t, s.hpa_value, config.settings.scale_down_stabilization_s
            ),
            total_changes=len(direction_changes(s.hpa_t, s.hpa_value)),
            ready_at_s=None if ready_at is None else ready_at - event,
            ttft_p50_s=float(np.percentile(window, 50)) if window.size else math.nan,
            ttft_p90_s=float(np.percentile(window, 90)) if window.size else math.nan,
            replica_s=self.pod_s,
            ideal_replica_s=sum(s.right) * round_s,
            unserved=len(unserved),
        )

    def _ttft_windows(self, served: np.ndarray[Any, Any], ttft: np.ndarray[Any, Any]) -> None:
        s, window = self.series, self.config.ttft_window_s
        order = np.argsort(served)
        served, ttft = served[order], ttft[order]
        for t in np.arange(window, self.scenario.duration_s + 1e-9, 5.0):
            lo, hi = np.searchsorted(served, [t - window, t])
            s.ttft_t.append(float(t))
            chunk = ttft[lo:hi]
            s.ttft_p50.append(float(np.percentile(chunk, 50)) if chunk.size else math.nan)
            s.ttft_p90.append(float(np.percentile(chunk, 90)) if chunk.size else math.nan)


def run_scaling(config: ScalingConfig | None = None, progress: bool = False) -> ScalingResult:
    """Every chosen scenario x strategy, all strategies of a scenario on the same arrivals."""
    config = config or ScalingConfig()
    table = strategies(config)
    total = len(config.strategies) * sum(
        tick_count(config.scenario(name).duration_s, config.tick_s) for name in config.scenarios
    )
    outcomes: list[ScenarioOutcome] = []
    with tqdm(total=total, desc="simulating", unit="tick", disable=not progress) as bar:
        for name in config.scenarios:
            scenario = config.scenario(name)
            arrivals = poisson_arrivals(scenario, config.seed, config.tick_s)
            runs = tuple(
                _Simulation(config, scenario, table[key], arrivals).run(bar.update)
                for key in config.strategies
            )
            outcomes.append(ScenarioOutcome(scenario, len(arrivals), runs))
    return ScalingResult(config, tuple(outcomes))
