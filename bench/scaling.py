"""``llm-gateway bench scaling``: how fast and how steadily an HPA follows the autoscaling signal.

A deterministic discrete-time simulation (0.1 s ticks, no processes, no sockets) of one pool of
vLLM replicas behind the gateway, scaled by a simulated Kubernetes HorizontalPodAutoscaler:

* Replicas are continuous-batching engines: at most ``max_num_seqs`` requests run at once and
  each reserves prompt + output tokens of KV cache at admission (like ``replica/sim``); the rest
  wait in the engine's own queue (``vllm:num_requests_waiting``). Prefill costs
  ``prefill_s_per_token`` per prompt token and every decode step ``decode_step_s +
  decode_s_per_seq x batch``, the timing model of the project's simulated replica.
* The gateway dispatches to the healthy replica with the fewest requests in flight and, with
  ``--inflight-limit``, holds requests itself when every replica is at the limit. Once a second
  it scrapes the engines and calls the real ``PoolState.update_desired`` (so
  ``router_policies.autoscale.desired_replicas``, ``RateMeter`` and ``ScaleDownStabilizer``),
  and it counts every request routed to the pool in ``PoolState.arrivals``, as it does live.
* Prometheus scrapes the gateway and the engines every ``--scrape-interval-s``; the HPA syncs
  every ``--hpa-sync-s`` on the latest scraped sample, with the ``autoscaling/v2`` rules for an
  External metric with an ``AverageValue`` target (10% tolerance, default rate limits). On the
  gateway's desired count, which the gateway already stabilizes, its scale-down window is 0 s;
  on the engine or gateway queues, the default 300 s.
* New replicas serve only after ``--cold-start-s`` (image pull and weight load); removed ones
  stop taking requests at once and finish what they hold.

Strategies, run on the same Poisson arrivals: A, the HPA on ``gateway_pool_desired_replicas``
(averageValue 1) with the default settings (queue term); P, on the same metric with
``target_rate_per_replica`` configured (rate term: arrival rate + backlog / backlog_drain_s);
B, on the engines' waiting queues, like vLLM's production stack
(``sum(vllm:num_requests_waiting)``, averageValue 5); C, on ``gateway_pool_queue_depth``
(averageValue = target_queue_per_replica). A and P differ only in their AutoscaleSettings: both
are the gateway's own code. See docs/scaling.md.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from gateway.state import EngineStats, PoolQueue, PoolState
from router_policies.schema import AutoscaleSettings, PoolPolicy

# ---------------------------------------------------------------------------------------------
# The engine model


@dataclass(frozen=True, slots=True)
class EngineModel:
    """One replica: Llama-3.1-8B-class model on one 80 GB GPU (see docs/scaling.md)."""

    max_num_seqs: int = 256
    """vLLM --max-num-seqs; production write-ups use 128-256 for 8B models."""
    kv_capacity_tokens: int = 400_000
    """KV-cache tokens: (0.9 x 80 GB - 16 GB weights - ~4 GB activations) / 128 KiB per token."""
    prompt_tokens: int = 1024
    output_tokens: int = 256
    prefill_s_per_token: float = 5e-5
    """20k prompt tokens/s, as the simulated replica (replica/sim/config.py)."""
    decode_step_s: float = 0.008
    """Fixed cost of a decode step (weights read once per step), as replica/sim."""
    decode_s_per_seq: float = 0.0002
    """Extra decode-step time per running sequence (KV reads), as replica/sim."""

    @property
    def tokens_per_request(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def admit_limit(self) -> int:
        """Requests that run at once: slots, and KV reservations that fit."""
        return max(1, min(self.max_num_seqs, self.kv_capacity_tokens // self.tokens_per_request))

    def step_s(self, batch: int) -> float:
        return self.decode_step_s + self.decode_s_per_seq * batch

    def rate_at(self, running: float) -> float:
        """Requests/s a replica completes in steady state with ``running`` decoding sequences.

        Per second the engine spends r x prompt x prefill_s_per_token on prefill and the rest on
        decode steps of ``running`` sequences, which must produce r x (output - 1) tokens (the
        first token comes out of the prefill): r = n / ((O-1) d0 + n (P p + (O-1) d1)).
        """
        decode = self.output_tokens - 1
        per_request = self.prompt_tokens * self.prefill_s_per_token
        return running / (
            decode * self.decode_step_s + running * (per_request + decode * self.decode_s_per_seq)
        )

    def running_at(self, rate: float) -> float:
        """Inverse of ``rate_at``: sequences running at ``rate`` requests/s (inf if unstable)."""
        decode = self.output_tokens - 1
        spare = 1.0 - rate * (
            self.prompt_tokens * self.prefill_s_per_token + decode * self.decode_s_per_seq
        )
        return math.inf if spare <= 0 else rate * decode * self.decode_step_s / spare

    def max_rate(self, kv_ceiling: float = 1.0) -> float:
        """Highest steady rate per replica with no standing queue and KV usage <= kv_ceiling."""
        by_kv = kv_ceiling * self.kv_capacity_tokens / self.tokens_per_request
        return self.rate_at(min(float(self.admit_limit), by_kv))

    def kv_usage_at(self, rate: float) -> float:
        return min(1.0, self.running_at(rate) * self.tokens_per_request / self.kv_capacity_tokens)


def right_replicas(rate: float, model: EngineModel, settings: AutoscaleSettings) -> int:
    """The smallest replica count that serves ``rate`` with no growing queue (so at most
    target_queue_per_replica waiting) and mean KV usage <= kv_usage_ceiling, from the fluid
    model; within the settings' bounds. The point the gateway's formula is meant to settle at."""
    wanted = math.ceil(rate / model.max_rate(settings.kv_usage_ceiling) - 1e-9)
    return min(max(wanted, settings.min_replicas), settings.max_replicas)


# ---------------------------------------------------------------------------------------------
# The Kubernetes HPA (autoscaling/v2, pkg/controller/podautoscaler)


def hpa_external_average_value(
    metric: float, target: float, current: int, tolerance: float = 0.1
) -> int:
    """Replicas an External metric with an AverageValue target asks for.

    As GetExternalPerPodMetricReplicas: usage ratio = metric / (target x current replicas);
    within the tolerance keep the current count, otherwise ceil(metric / target), which does
    not depend on the current count.
    """
    if current > 0 and abs(1.0 - metric / (target * current)) <= tolerance:
        return current
    return math.ceil(metric / target - 1e-9)


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    """The defaults of autoscaling/v2 when ``behavior`` is left out."""

    scale_up_window_s: float = 0.0
    scale_up: tuple[ScalingPolicy, ...] = (
        ScalingPolicy("Percent", 100, 15.0),
        ScalingPolicy("Pods", 4, 15.0),
    )
    scale_down_window_s: float = 300.0
    scale_down: tuple[ScalingPolicy, ...] = (ScalingPolicy("Percent", 100, 15.0),)


class Hpa:
    """The HPA controller's per-sync arithmetic: metric -> recommendation -> stabilization ->
    rate limits -> min/max. Select policy is Max (the default) in both directions."""

    def __init__(
        self,
        target: float,
        min_replicas: int,
        max_replicas: int,
        behavior: HpaBehavior = HpaBehavior(),
        tolerance: float = 0.1,
    ) -> None:
        self.target = target
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.behavior = behavior
        self.tolerance = tolerance
        self._recommendations: list[tuple[float, int]] = []
        self._up_events: list[tuple[float, int]] = []
        self._down_events: list[tuple[float, int]] = []

    def recommend(self, metric: float, current: int) -> int:
        return hpa_external_average_value(metric, self.target, current, self.tolerance)

    def sync(self, now: float, metric: float, current: int) -> int:
        """The replica count the HPA writes to the scale subresource at this sync."""
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            desired = self._normalize(now, self.recommend(metric, current), current)
        if desired > current:
            self._up_events.append((now, desired - current))
        elif desired < current:
            self._down_events.append((now, current - desired))
        return desired

    def _normalize(self, now: float, raw: int, current: int) -> int:
        behavior = self.behavior
        up_cut = now - behavior.scale_up_window_s
        down_cut = now - behavior.scale_down_window_s
        up, down = raw, raw
        for at, value in self._recommendations:
            if at > up_cut:
                up = min(up, value)
            if at > down_cut:
                down = max(down, value)
        keep = max(behavior.scale_up_window_s, behavior.scale_down_window_s)
        self._recommendations = [(a, v) for a, v in self._recommendations if a > now - keep]
        self._recommendations.append((now, raw))
        stabilized = min(max(current, up), down)
        if stabilized > current:
            limit = max(self._limit(now, current, p, up=True) for p in behavior.scale_up)
            return min(stabilized, max(limit, current), self.max_replicas)
        if stabilized < current:
            limit = min(self._limit(now, current, p, up=False) for p in behavior.scale_down)
            return max(stabilized, min(limit, current), self.min_replicas)
        return stabilized

    def _limit(self, now: float, current: int, policy: ScalingPolicy, up: bool) -> int:
        cut = now - policy.period_s
        added = sum(n for at, n in self._up_events if at > cut)
        removed = sum(n for at, n in self._down_events if at > cut)
        start = current - added + removed
        if policy.kind == "Pods":
            return start + policy.value if up else start - policy.value
        if up:
            return math.ceil(start * (1 + policy.value / 100))
        return int(start * (1 - policy.value / 100))


# ---------------------------------------------------------------------------------------------
# Scenarios and configuration


@dataclass(frozen=True, slots=True)
class Scenario:
    """Arrival rate over time: ``step`` (x factor at event_s, held) or ``ramp`` (linear rise to
    x factor over rise_s from event_s, linear fall over as long, then base again)."""

    name: str
    base_rate: float
    factor: float
    event_s: float
    duration_s: float
    rise_s: float = 0.0

    def rate(self, t: float) -> float:
        high = self.base_rate * self.factor
        if t < self.event_s:
            return self.base_rate
        if self.name == "step":
            return high
        into = t - self.event_s
        if into < self.rise_s:
            return self.base_rate + (high - self.base_rate) * into / self.rise_s
        if into < 2 * self.rise_s:
            return high - (high - self.base_rate) * (into - self.rise_s) / self.rise_s
        return self.base_rate


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    seed: int = 1
    cold_start_s: float = 90.0
    """Pod created -> serving: image pull (cached node: seconds; cold: minutes) plus loading
    16 GB of weights and CUDA-graph capture; 60-120 s is typical for an 8B model."""
    scrape_interval_s: float = 15.0
    """Prometheus scrape interval of the gateway and the engines."""
    hpa_sync_s: float = 15.0
    """kube-controller-manager --horizontal-pod-autoscaler-sync-period."""
    hpa_scale_down_window_s: float = 0.0
    """behavior.scaleDown.stabilizationWindowSeconds of the HPA on the gateway's desired count
    (A, P): 0, since the gateway already holds it for scale_down_stabilization_s (300 s); the
    HPA's own default would add another 300 s. The Helm chart sets the same."""
    queue_hpa_scale_down_window_s: float = 300.0
    """The same for the HPA on a queue (B, C), which nothing else stabilizes: the default 300."""
    hpa_phase_s: float = 7.5
    """HPA syncs this long after each scrape (they are not aligned; half an interval)."""
    gateway_round_s: float = 1.0
    """Gateway scrape + update_desired cadence (GATEWAY_SCRAPE_INTERVAL_S default)."""
    tick_s: float = 0.1
    base_rate: float = 12.0
    factor: float = 4.0
    event_s: float = 60.0
    step_duration_s: float = 1200.0
    ramp_rise_s: float = 300.0
    ramp_duration_s: float = 1260.0
    inflight_limit: int | None = None
    """PoolPolicy.max_inflight_per_replica: beyond it requests wait in the gateway."""
    engine: EngineModel = EngineModel()
    settings: AutoscaleSettings = field(default_factory=lambda: AutoscaleSettings(min_replicas=2))
    """The gateway's autoscale settings: schema defaults (no target_rate_per_replica, so the
    queue term) but min_replicas, also every strategy's HPA floor: the right value at the base
    load (``baseline_settings``), 2 for the default 12 req/s. A, B and C run these."""
    target_utilization: float = 0.8
    """P: target_rate_per_replica as a share of the measured per-replica capacity (the model's
    max_rate); the headroom covers the load that arrives during a cold start."""
    backlog_drain_s: float = AutoscaleSettings().backlog_drain_s
    """P: the gateway's backlog_drain_s (the schema default, 120 s)."""
    rate_window_s: float = 15.0
    """P: the gateway's rate_window_s. 15 s, as docs/scaling.md tells operators to set it: with
    the schema default of 60 s the signal reaches the right value a scrape interval late."""
    strategies: tuple[str, ...] = ("A", "B", "C", "P")
    scenarios: tuple[str, ...] = ("step", "ramp")
    ttft_window_s: float = 30.0

    def scenario(self, name: str) -> Scenario:
        if name == "step":
            return Scenario("step", self.base_rate, self.factor, self.event_s, self.step_duration_s)
        return Scenario(
            "ramp",
            self.base_rate,
            self.factor,
            self.event_s,
            self.ramp_duration_s,
            self.ramp_rise_s,
        )

    @property
    def target_rate_per_replica(self) -> float:
        """What an operator configures: measured capacity x target utilisation."""
        return self.target_utilization * self.engine.max_rate(self.settings.kv_usage_ceiling)

    def settings_for(self, key: str) -> AutoscaleSettings:
        """The gateway's AutoscaleSettings under strategy ``key``: P configures the rate term
        (target_rate_per_replica, backlog_drain_s, rate_window_s); the others keep ``settings``."""
        if key != "P":
            return self.settings
        return AutoscaleSettings.model_validate(
            {
                **self.settings.model_dump(),
                "target_rate_per_replica": self.target_rate_per_replica,
                "backlog_drain_s": self.backlog_drain_s,
                "rate_window_s": self.rate_window_s,
            }
        )


@dataclass(frozen=True, slots=True)
class Strategy:
    key: str
    label: str
    metric: str
    target: float
    stabilized: bool
    """The metric is the gateway's desired count, already scale-down stabilized: the HPA runs
    with hpa_scale_down_window_s rather than queue_hpa_scale_down_window_s."""


STRATEGY_KEYS = ("A", "B", "C", "P")


def strategies(config: ScalingConfig) -> dict[str, Strategy]:
    s = config.settings
    desired = "gateway_pool_desired_replicas"
    return {
        "A": Strategy("A", "gateway desired (default settings)", desired, 1, True),
        "B": Strategy(
            "B", "engine waiting queue (vLLM stack)", "sum(vllm:num_requests_waiting)", 5, False
        ),
        "C": Strategy(
            "C",
            "gateway queue depth",
            "gateway_pool_queue_depth",
            s.target_queue_per_replica,
            False,
        ),
        "P": Strategy("P", "gateway desired (target rate set)", desired, 1, True),
    }


# ---------------------------------------------------------------------------------------------
# The simulation


class _SimQueue(PoolQueue):
    """The gateway's waiting line as PoolState counts it: its length is the simulator's."""

    def __init__(self, line: deque[float]) -> None:
        super().__init__()
        self._line = line

    def __len__(self) -> int:
        return len(self._line)


class _Timing:
    """EngineModel figures the inner loop reads, looked up once."""

    __slots__ = ("d0", "d1", "decode_tokens", "limit", "per_token", "prompt")

    def __init__(self, model: EngineModel) -> None:
        self.limit = model.admit_limit
        self.prompt = float(model.prompt_tokens)
        self.per_token = model.prefill_s_per_token
        self.decode_tokens = model.output_tokens - 1
        self.d0 = model.decode_step_s
        self.d1 = model.decode_s_per_seq


class _Pod:
    """One replica: the engine's waiting queue, its running requests, and its pod lifecycle."""

    __slots__ = (
        "clock",
        "created_s",
        "decoding",
        "draining",
        "healthy",
        "inflight",
        "name",
        "prefill",
        "ready_s",
        "running",
        "waiting",
    )

    def __init__(self, name: str, created_s: float, ready_s: float) -> None:
        self.name = name
        self.created_s = created_s
        self.ready_s = ready_s
        self.healthy = False
        self.draining = False
        self.waiting: deque[float] = deque()
        """Arrival times of the requests in the engine's waiting queue."""
        self.prefill: deque[list[float]] = deque()
        """[arrival time, prompt tokens left] of admitted requests still in prefill."""
        self.decoding: list[float] = []
        """Heap of the decode clock values at which each decoding request finishes."""
        self.clock = 0.0
        """Decode steps taken so far: every decoding request gains one token per step."""
        self.running = 0
        self.inflight = 0
        """Requests the gateway sent here and not yet finished (waiting + running)."""

    def kv_usage(self, model: EngineModel) -> float:
        return self.running * model.tokens_per_request / model.kv_capacity_tokens

    def advance(self, now: float, dt: float, timing: _Timing, first_tokens: list[float]) -> None:
        """Run the engine for dt seconds: admit, prefill in arrival order, then decode steps.

        Chunked prefill mixes prompt chunks into decode steps; over a tick the GPU time is
        the same as prefilling first and decoding in the rest, which is what this does.
        """
        waiting, prefill = self.waiting, self.prefill
        while waiting and self.running < timing.limit:
            prefill.append([waiting.popleft(), timing.prompt])
            self.running += 1
        cursor = 0.0
        per_token = timing.per_token
        while prefill:
            item = prefill[0]
            need = item[1] * per_token
            if cursor + need > dt:
                item[1] -= (dt - cursor) / per_token
                cursor = dt
                break
            cursor += need
            prefill.popleft()
            first_tokens.append(item[0])
            first_tokens.append(now + cursor)
            heapq.heappush(self.decoding, self.clock + timing.decode_tokens)
        decoding = self.decoding
        if decoding and cursor < dt:
            self.clock += (dt - cursor) / (timing.d0 + timing.d1 * len(decoding))
            done = 0
            while decoding and decoding[0] <= self.clock + 1e-9:
                heapq.heappop(decoding)
                done += 1
            self.running -= done
            self.inflight -= done

    def held(self) -> list[float]:
        """Arrival times of the requests here that have no first token yet."""
        return [*self.waiting, *(item[0] for item in self.prefill)]


def replica_steady_state(
    model: EngineModel, rate: float, seconds: float = 600.0, seed: int = 1, tick_s: float = 0.1
) -> tuple[float, float, float]:
    """One simulated replica fed Poisson arrivals at ``rate``: (completions/s, mean waiting,
    mean running) over the run after its first sixth (the warm-up). Checks the fluid model."""
    arrivals = poisson_arrivals(Scenario("step", rate, 1.0, 0.0, seconds), seed, tick_s)
    pod, timing = _Pod("replica", 0.0, 0.0), _Timing(model)
    first: list[float] = []
    ticks, warm = _ticks(seconds, tick_s), _ticks(seconds / 6, tick_s)
    upcoming, finished, waiting, running = 0, 0, 0, 0
    for k in range(ticks):
        now = k * tick_s
        while upcoming < len(arrivals) and arrivals[upcoming] < now:
            pod.waiting.append(arrivals[upcoming])
            pod.inflight += 1
            upcoming += 1
        before = pod.inflight
        pod.advance(now, tick_s, timing, first)
        if k >= warm:
            finished += before - pod.inflight
            waiting += len(pod.waiting)
            running += pod.running
    measured = ticks - warm
    return finished / (measured * tick_s), waiting / measured, running / measured


@dataclass(slots=True)
class Series:
    """One strategy in one scenario: 1 s samples (t), scrapes (scrape_t), HPA syncs (hpa_t)."""

    t: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    pods: list[int] = field(default_factory=list)
    hpa_target: list[int] = field(default_factory=list)
    signal: list[float] = field(default_factory=list)
    queue_depth: list[int] = field(default_factory=list)
    gateway_waiting: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    scrape_t: list[float] = field(default_factory=list)
    scrape_signal: list[float] = field(default_factory=list)
    hpa_t: list[float] = field(default_factory=list)
    hpa_value: list[int] = field(default_factory=list)
    ttft_t: list[float] = field(default_factory=list)
    ttft_p50: list[float] = field(default_factory=list)
    ttft_p90: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Summary:
    right_after: int
    """The right replica count at the peak load after the event."""
    reach_intervals: float | None
    """Step only (NaN on a ramp): scrape intervals from the step until the scraped signal first
    is at least right_after; None if it never is."""
    signal_at_2: float
    """Step only: the scraped signal two scrape intervals after the step."""
    lag_intervals: float | None
    """Worst delay, over every rise of the right value, until the HPA target reaches it."""
    short_s: float
    """Seconds after the event with fewer ready replicas than the right value."""
    peak_signal: float
    peak_target: int
    max_changes_per_window: int
    """Most direction changes of the HPA target within any stabilization window."""
    total_changes: int
    ready_at_s: float | None
    """Seconds from the event until right_after replicas first serve."""
    ttft_p50_s: float
    ttft_p90_s: float
    """TTFT of requests arriving after the event (step: 300 s; ramp: the rise and the fall);
    those still without a first token at the end count with the time they waited."""
    replica_s: float
    """Pod-seconds, from creation (a starting pod holds its GPU) until removed and drained."""
    ideal_replica_s: float
    """The right value integrated over the run: perfect foresight and no cold start."""
    unserved: int
    """Requests without a first token at the end of the run."""

    @property
    def acceptance(self) -> bool:
        """Signal at the right value within 2 scrape intervals of a step, and at most one
        direction change of the HPA target per stabilization window."""
        return (
            self.reach_intervals is not None
            and self.reach_intervals <= 2
            and self.max_changes_per_window <= 1
        )


@dataclass(frozen=True, slots=True)
class StrategyOutcome:
    strategy: Strategy
    series: Series
    summary: Summary


@dataclass(frozen=True, slots=True)
class ScenarioOutcome:
    scenario: Scenario
    arrivals: int
    outcomes: tuple[StrategyOutcome, ...]


@dataclass(frozen=True, slots=True)
class ScalingResult:
    config: ScalingConfig
    scenarios: tuple[ScenarioOutcome, ...]


def poisson_arrivals(scenario: Scenario, seed: int, tick_s: float) -> list[float]:
    """Sorted arrival times: per tick, Poisson(rate x tick) arrivals spread uniformly in it."""
    rng = np.random.default_rng(seed)
    ticks = _ticks(scenario.duration_s, tick_s)
    starts = np.arange(ticks) * tick_s
    rates = np.array([scenario.rate(t + tick_s / 2) for t in starts])
    counts = rng.poisson(rates * tick_s)
    times = np.repeat(starts, counts) + rng.uniform(0.0, tick_s, int(counts.sum()))
    return [float(t) for t in np.sort(times)]


def _ticks(seconds: float, tick_s: float) -> int:
    return max(1, round(seconds / tick_s))


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
        self.timing = _Timing(config.engine)
        self.settings = settings = config.settings_for(strategy.key)
        self.line: deque[float] = deque()
        """The gateway's own waiting line (arrival times), first come first served."""
        self.pods: list[_Pod] = []
        self.draining: list[_Pod] = []
        self.serial = 0
        initial = right_replicas(scenario.base_rate, self.model, settings)
        for _ in range(initial):
            self._create(0.0, ready_s=0.0)
        self.pool = self._pool(None)
        # The gateway has counted the base load for a rate window before t=0, as one that has
        # been up a while. (Just started, its RateMeter averages over a second or two of
        # Poisson noise and P may ask for a replica too many, held for the stabilization window.)
        window = settings.rate_window_s
        self.pool.arrival_meter.rate(-window, 0)
        self.pool.arrivals = round(scenario.base_rate * window)
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
        pod = _Pod(f"10.0.{self.serial // 250}.{self.serial % 250 + 1}:8000", now, ready_s)
        pod.healthy = ready_s <= now
        self.pods.append(pod)

    def _pool(self, previous: PoolState | None) -> PoolState:
        """The gateway's pool over the current pods, rebuilt as a policy reload rebuilds it."""
        policy = PoolPolicy(
            model="sim",
            replicas=[f"http://{p.name}" for p in self.pods],
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
        for pod in self.pods:
            if pod.healthy:
                self.pool.replicas[pod.name].engine = EngineStats(
                    running=float(pod.running),
                    waiting=float(len(pod.waiting)),
                    kv_usage=pod.kv_usage(model),
                    kv_capacity_tokens=model.kv_capacity_tokens,
                )
        self.pool.update_desired(now)

    def dispatch(self) -> None:
        """Each waiting request to the healthy replica with the fewest in flight, while one has
        room under the in-flight limit."""
        line = self.line
        if not line:
            return
        open_ = [p for p in self.pods if p.healthy]
        limit = self.config.inflight_limit
        if limit is not None:
            open_ = [p for p in open_ if p.inflight < limit]
        least = attrgetter("inflight")
        while line and open_:
            pod = min(open_, key=least)
            pod.waiting.append(line.popleft())
            pod.inflight += 1
            if limit is not None and pod.inflight >= limit:
                open_.remove(pod)

    # -- Prometheus and the HPA -----------------------------------------------------------

    def metric(self) -> float:
        """The strategy's metric as Prometheus scrapes it now."""
        key = self.strategy.key
        if key == "B":
            return float(sum(len(p.waiting) for p in self.pods if p.healthy))
        if key == "C":
            return float(self.pool.load().queue_depth)
        return float(self.pool.desired)  # A, P: gateway_pool_desired_replicas

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
        ticks = _ticks(scenario.duration_s, dt)
        round_every = _ticks(config.gateway_round_s, dt)
        scrape_every = _ticks(config.scrape_interval_s, dt)
        hpa_every = _ticks(config.hpa_sync_s, dt)
        hpa_offset = _ticks(config.hpa_phase_s, dt) % hpa_every
        arrivals, total, upcoming = self.arrivals, len(self.arrivals), 0
        derived = self.strategy.key in ("B", "C")
        series, first = self.series, self.first_tokens
        for k in range(ticks):
            now = k * dt
            while upcoming < total and arrivals[upcoming] < now:
                self.line.append(arrivals[upcoming])
                self.pool.arrivals += 1  # the gateway counts each request routed to the pool
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
            self.dispatch()
            for pod in self.pods:
                if pod.inflight:
                    pod.advance(now, dt, timing, first)
            if self.draining:
                for pod in self.draining:
                    pod.advance(now, dt, timing, first)
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
            hit = _first_at_least(s.scrape_t, s.scrape_signal, event, right_after)
            reach = None if hit is None else (hit - event) / interval
            after = [v for t, v in zip(s.scrape_t, s.scrape_signal, strict=True) if t >= event]
            signal_at_2 = after[min(2, len(after) - 1)] if after else math.nan
        lag = _worst_lag(s.t, s.right, s.hpa_target)
        ready_at = _first_at_least(s.t, s.ready, event, right_after)
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


def _first_at_least(
    times: Sequence[float], values: Sequence[float], start: float, level: float
) -> float | None:
    return next((t for t, v in zip(times, values, strict=True) if t >= start and v >= level), None)


def _worst_lag(times: Sequence[float], right: Sequence[int], target: Sequence[int]) -> float | None:
    """Longest wait, over every rise of the right value, until the HPA target reaches it."""
    worst = 0.0
    for i in range(1, len(right)):
        if right[i] > right[i - 1]:
            hit = _first_at_least(times, target, times[i], right[i])
            if hit is None:
                return None
            worst = max(worst, hit - times[i])
    return worst


def direction_changes(times: Sequence[float], values: Sequence[int]) -> list[float]:
    """Times at which a series that was rising starts falling, or the other way round."""
    changes: list[float] = []
    last = 0
    for i in range(1, len(values)):
        delta = values[i] - values[i - 1]
        if delta == 0:
            continue
        sign = 1 if delta > 0 else -1
        if last and sign != last:
            changes.append(times[i])
        last = sign
    return changes


def max_direction_changes(times: Sequence[float], values: Sequence[int], window_s: float) -> int:
    """Most direction changes inside any window of window_s seconds."""
    changes = direction_changes(times, values)
    best, lo = 0, 0
    for hi, t in enumerate(changes):
        while changes[lo] < t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def run_scaling(config: ScalingConfig | None = None, progress: bool = False) -> ScalingResult:
    """Every chosen scenario x strategy, all strategies of a scenario on the same arrivals."""
    config = config or ScalingConfig()
    table = strategies(config)
    total = len(config.strategies) * sum(
        _ticks(config.scenario(name).duration_s, config.tick_s) for name in config.scenarios
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


# ---------------------------------------------------------------------------------------------
# Report and plots


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "never"
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _describe(scenario: Scenario) -> str:
    low, high = scenario.base_rate, scenario.base_rate * scenario.factor
    if scenario.name == "step":
        return f"{low:g} -> {high:g} req/s at t={scenario.event_s:g} s"
    return (
        f"{low:g} -> {high:g} req/s linearly over {scenario.rise_s:g} s from "
        f"t={scenario.event_s:g} s, back over {scenario.rise_s:g} s"
    )


def format_report(result: ScalingResult) -> str:
    c = result.config
    m, s = c.engine, c.settings
    table = strategies(c)
    cap = m.max_rate(s.kv_usage_ceiling)
    lines = [
        "Autoscaling simulation (bench/scaling.py)",
        "",
        f"engine   max_num_seqs {m.max_num_seqs}, KV {m.kv_capacity_tokens:,} tokens, "
        f"{m.prompt_tokens} prompt + {m.output_tokens} output tokens per request, decode step "
        f"{m.decode_step_s * 1e3:g} ms + {m.decode_s_per_seq * 1e3:g} ms/seq, prefill "
        f"{m.prefill_s_per_token * 1e6:g} us/token",
        f"         capacity {cap:.2f} req/s per replica with no standing queue and KV <= "
        f"{s.kv_usage_ceiling:g} (running {min(m.running_at(cap), m.admit_limit):.0f}, KV "
        f"{m.kv_usage_at(cap):.2f} there); at 60% of it: running "
        f"{m.running_at(0.6 * cap):.0f}, KV {m.kv_usage_at(0.6 * cap):.2f}",
        f"gateway  target_queue_per_replica {s.target_queue_per_replica:g}, kv_usage_ceiling "
        f"{s.kv_usage_ceiling:g}, replicas {s.min_replicas}-{s.max_replicas}, stabilization "
        f"{s.scale_down_stabilization_s:g} s, update_desired every {c.gateway_round_s:g} s, "
        f"in-flight limit {c.inflight_limit or 'none'}",
        f"         A: target_rate_per_replica unset (queue term); P: target_rate_per_replica "
        f"{c.target_rate_per_replica:.2f} req/s ({c.target_utilization:g} x capacity), "
        f"backlog_drain_s {c.backlog_drain_s:g}, rate_window_s {c.rate_window_s:g}",
        f"cluster  cold start {c.cold_start_s:g} s, scrape every {c.scrape_interval_s:g} s, HPA "
        f"sync every {c.hpa_sync_s:g} s ({c.hpa_phase_s:g} s after a scrape), tolerance 0.1, "
        "default rate limits (up: max(+100%, +4 pods) per 15 s; down: 100% per 15 s), "
        f"min/max as the gateway's, seed {c.seed}",
        f"         scale-down stabilization window {c.hpa_scale_down_window_s:g} s on the "
        f"gateway's desired count (A, P), {c.queue_hpa_scale_down_window_s:g} s on queues (B, C)",
        "",
    ]
    for key in c.strategies:
        strategy = table[key]
        lines.append(
            f"{key}  {strategy.label}: HPA on {strategy.metric}, averageValue {strategy.target:g}"
        )
    header = (
        "  strategy                              reach  sig@2   lag  peak sig/tgt  chg/300s"
        "  total  ready@  short  TTFT p50/p90 s   pod-h  open@end"
    )
    for outcome in result.scenarios:
        sc = outcome.scenario
        first = outcome.outcomes[0].summary
        lines += [
            "",
            f"== {sc.name}: {_describe(sc)}, {sc.duration_s:g} s, {outcome.arrivals} requests; "
            f"right value {right_replicas(sc.base_rate, m, s)} -> {first.right_after} replicas "
            f"(ideal {first.ideal_replica_s / 3600:.2f} pod-h)",
            "",
            header,
        ]
        for run in outcome.outcomes:
            x = run.summary
            ttft = f"{_fmt(x.ttft_p50_s, 2)}/{_fmt(x.ttft_p90_s, 1)}"
            lines.append(
                f"  {run.strategy.key} {run.strategy.label:<35} {_fmt(x.reach_intervals):>5}  "
                f"{_fmt(x.signal_at_2, 0):>5}  {_fmt(x.lag_intervals):>4}  "
                f"{_fmt(x.peak_signal, 0):>4}/{x.peak_target:<4}  {x.max_changes_per_window:>8}  "
                f"{x.total_changes:>5}  {_fmt(x.ready_at_s, 0):>6}  {x.short_s:>5.0f}  "
                f"{ttft:>14}  {x.replica_s / 3600:>6.2f}  {x.unserved:>8}"
            )
    lines += [
        "",
        "reach: scrape intervals from the step until the scraped signal (B, C: the replicas",
        "  the HPA derives, ceil(metric / averageValue)) is first at least the right value;",
        "  sig@2: that signal two intervals after the step; lag: worst scrape intervals from a",
        "  rise of the right value until the HPA target reaches it; chg/300s: most direction",
        "  changes of the HPA target in any stabilization window; ready@: seconds from the event",
        "  until the right value of replicas serve; short: seconds with fewer; TTFT: requests",
        "  arriving in the 300 s after the step (ramp: during the rise and fall); pod-h: pod",
        "  hours including cold starts and draining; open@end: requests with no first token when",
        "  the run ends.",
        "",
        "acceptance (step): the signal reaches the right value within 2 scrape intervals and",
        "the HPA target changes direction at most once per stabilization window",
    ]
    for outcome in result.scenarios:
        if outcome.scenario.name != "step":
            continue
        for run in outcome.outcomes:
            x = run.summary
            verdict = "PASS" if x.acceptance else "FAIL"
            over = x.peak_signal / x.right_after
            lines.append(
                f"  {run.strategy.key} {verdict}: reach {_fmt(x.reach_intervals)} intervals "
                f"(signal peaks at {x.peak_signal:g} = {over:.1f} x right value), "
                f"{x.max_changes_per_window} direction change(s) in a window, "
                f"{x.total_changes} in all"
            )
    return "\n".join(lines) + "\n"


_COLORS = {"A": "tab:blue", "B": "tab:red", "C": "tab:purple", "P": "tab:green"}


def plot(outcome: ScenarioOutcome, path: Path, config: ScalingConfig) -> None:
    """One PNG: replicas per strategy (ready, scraped signal, HPA target, right value), then
    queue depth and TTFT p90 of every strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = outcome.outcomes
    rows = len(runs) + 2
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.3 * rows), sharex=True)
    event = outcome.scenario.event_s
    ceiling = config.settings.max_replicas * 1.08 + 1
    for ax, run in zip(axes, runs, strict=False):
        s = run.series
        ax.step(s.t, s.right, where="post", color="black", ls=":", lw=1.2, label="right value")
        ax.step(s.t, s.signal, where="post", color="tab:orange", lw=1.1, label="signal (scraped)")
        ax.step(s.t, s.hpa_target, where="post", color="tab:blue", lw=1.4, label="HPA target")
        ax.step(s.t, s.ready, where="post", color="tab:green", lw=2.0, label="ready")
        ax.set_ylim(0, min(max(*s.hpa_target, *s.right) * 1.2 + 1, ceiling))
        ax.set_ylabel("replicas")
        ax.set_title(
            f"{run.strategy.key}: {run.strategy.label}; HPA on {run.strategy.metric}",
            fontsize=10,
            loc="left",
        )
    queue_ax, ttft_ax = axes[-2], axes[-1]
    for run in runs:
        s, color = run.series, _COLORS[run.strategy.key]
        queue_ax.plot(s.t, s.queue_depth, color=color, lw=1.0, alpha=0.85, label=run.strategy.key)
        ttft_ax.plot(s.ttft_t, s.ttft_p90, color=color, lw=1.2, alpha=0.85, label=run.strategy.key)
    queue_ax.set_yscale("symlog", linthresh=10)
    queue_ax.set_ylabel("queue depth")
    queue_ax.set_title("requests waiting (gateway + engines)", fontsize=10, loc="left")
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT p90 (s)")
    ttft_ax.set_title(
        f"TTFT p90 of the requests served in the last {config.ttft_window_s:g} s",
        fontsize=10,
        loc="left",
    )
    ttft_ax.set_xlabel("time (s)")
    for ax in axes:
        ax.axvline(event, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, ncol=5)
    rate_ax = axes[0].twinx()
    rate_ax.plot(runs[0].series.t, runs[0].series.rate, color="grey", lw=0.8, alpha=0.5)
    rate_ax.set_ylabel("arrivals (req/s)", color="grey")
    rate_ax.set_ylim(0, None)
    fig.suptitle(
        f"{outcome.scenario.name}: {_describe(outcome.scenario)}; cold start "
        f"{config.cold_start_s:g} s, scrape {config.scrape_interval_s:g} s, seed {config.seed}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ScalingConfig()
    add = parser.add_argument
    add(
        "--cold-start-s",
        type=float,
        default=d.cold_start_s,
        help="seconds from pod creation until it serves (default: %(default)s)",
    )
    add("--seed", type=int, default=d.seed, help="arrivals seed (default: %(default)s)")
    add(
        "--out",
        type=Path,
        default=Path("docs"),
        help="folder for scaling-step.png and scaling-ramp.png (default: %(default)s)",
    )
    add("--no-out", action="store_true", help="print the report only, draw no plots")
    add(
        "--scrape-interval-s",
        type=float,
        default=d.scrape_interval_s,
        help="Prometheus scrape interval (default: %(default)s)",
    )
    add(
        "--hpa-sync-s",
        type=float,
        default=d.hpa_sync_s,
        help="HPA sync period; it runs half a period after a scrape (default: %(default)s)",
    )
    add(
        "--hpa-scale-down-window-s",
        type=float,
        default=d.hpa_scale_down_window_s,
        help="the HPA's scale-down stabilization window on the gateway's desired count, A and P "
        "(default: %(default)s; the gateway already stabilizes it)",
    )
    add(
        "--queue-hpa-scale-down-window-s",
        type=float,
        default=d.queue_hpa_scale_down_window_s,
        help="the HPA's scale-down stabilization window on a queue, B and C (default: %(default)s)",
    )
    add(
        "--base-rate",
        type=float,
        default=d.base_rate,
        help="requests/s before the step or ramp; min replicas serve it (default: %(default)s)",
    )
    add("--factor", type=float, default=d.factor, help="peak / base rate (default: %(default)s)")
    add(
        "--inflight-limit",
        type=int,
        default=None,
        help="the gateway's max_inflight_per_replica (default: none)",
    )
    add(
        "--max-num-seqs",
        type=int,
        default=d.engine.max_num_seqs,
        help="engine slots (default: %(default)s)",
    )
    add(
        "--kv-capacity-tokens",
        type=int,
        default=d.engine.kv_capacity_tokens,
        help="KV-cache tokens per replica (default: %(default)s)",
    )
    add(
        "--prompt-tokens",
        type=int,
        default=d.engine.prompt_tokens,
        help="prompt tokens per request (default: %(default)s)",
    )
    add(
        "--output-tokens",
        type=int,
        default=d.engine.output_tokens,
        help="output tokens per request (default: %(default)s)",
    )
    add(
        "--target-utilization",
        type=float,
        default=d.target_utilization,
        help="P: target_rate_per_replica as a share of the replica's capacity (default: "
        "%(default)s)",
    )
    add(
        "--backlog-drain-s",
        type=float,
        default=d.backlog_drain_s,
        help="P: the gateway's backlog_drain_s (default: %(default)s)",
    )
    add(
        "--rate-window-s",
        type=float,
        default=d.rate_window_s,
        help="P: the gateway's rate_window_s (default: %(default)s; the schema's is 60)",
    )
    add(
        "--strategies",
        default=",".join(d.strategies),
        help=f"subset of {','.join(STRATEGY_KEYS)} (default: %(default)s)",
    )
    add(
        "--scenarios",
        default=",".join(d.scenarios),
        help="subset of step,ramp (default: %(default)s)",
    )
    add("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> ScalingConfig:
    """The configuration the arguments ask for; ValueError when they make no sense."""
    chosen = tuple(dict.fromkeys(k.strip().upper() for k in args.strategies.split(",")))
    scenarios = tuple(dict.fromkeys(k.strip().lower() for k in args.scenarios.split(",")))
    if not chosen or any(k not in STRATEGY_KEYS for k in chosen):
        raise ValueError(f"--strategies takes a subset of {','.join(STRATEGY_KEYS)}")
    if not scenarios or any(k not in ("step", "ramp") for k in scenarios):
        raise ValueError("--scenarios takes a subset of step,ramp")
    if args.cold_start_s < 0 or args.scrape_interval_s < 1 or args.hpa_sync_s < 1:
        raise ValueError("--cold-start-s must be >= 0, the intervals >= 1 s")
    if args.hpa_scale_down_window_s < 0 or args.queue_hpa_scale_down_window_s < 0:
        raise ValueError("the HPA scale-down windows must be >= 0")
    if args.base_rate <= 0 or args.factor <= 0:
        raise ValueError("--base-rate and --factor must be positive")
    if args.output_tokens < 2 or args.prompt_tokens < 1 or args.max_num_seqs < 1:
        raise ValueError("--output-tokens must be >= 2, --prompt-tokens and --max-num-seqs >= 1")
    if args.inflight_limit is not None and args.inflight_limit < 1:
        raise ValueError("--inflight-limit must be >= 1")
    if not 0 < args.target_utilization <= 1:
        raise ValueError("--target-utilization must be in (0, 1]")
    if args.backlog_drain_s <= 0 or args.rate_window_s <= 0:
        raise ValueError("--backlog-drain-s and --rate-window-s must be > 0")
    defaults = ScalingConfig()
    engine = replace(
        defaults.engine,
        max_num_seqs=args.max_num_seqs,
        kv_capacity_tokens=args.kv_capacity_tokens,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    if engine.kv_capacity_tokens < engine.tokens_per_request:
        raise ValueError("--kv-capacity-tokens must hold at least one request")
    return replace(
        defaults,
        seed=args.seed,
        cold_start_s=args.cold_start_s,
        scrape_interval_s=args.scrape_interval_s,
        hpa_sync_s=args.hpa_sync_s,
        hpa_phase_s=args.hpa_sync_s / 2,
        hpa_scale_down_window_s=args.hpa_scale_down_window_s,
        queue_hpa_scale_down_window_s=args.queue_hpa_scale_down_window_s,
        base_rate=args.base_rate,
        factor=args.factor,
        inflight_limit=args.inflight_limit,
        engine=engine,
        settings=baseline_settings(defaults.settings, engine, args.base_rate),
        target_utilization=args.target_utilization,
        backlog_drain_s=args.backlog_drain_s,
        rate_window_s=args.rate_window_s,
        strategies=chosen,
        scenarios=scenarios,
    )


def baseline_settings(
    settings: AutoscaleSettings, engine: EngineModel, base_rate: float
) -> AutoscaleSettings:
    """The settings with min_replicas at the right value for the base load, as an operator
    sizes the floor, so that every strategy starts from the same steady state."""
    floor = right_replicas(base_rate, engine, settings.model_copy(update={"min_replicas": 1}))
    return AutoscaleSettings.model_validate(
        {**settings.model_dump(), "min_replicas": min(floor, settings.max_replicas)}
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``llm-gateway bench scaling``; 0 on success, 2 on bad arguments."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_scaling(config, progress=not args.no_progress)
    sys.stdout.write(format_report(result))
    sys.stdout.flush()
    if not args.no_out:
        for outcome in result.scenarios:
            path = args.out / f"scaling-{outcome.scenario.name}.png"
            plot(outcome, path, config)
            print(f"wrote {path}", file=sys.stderr)
    return 0
