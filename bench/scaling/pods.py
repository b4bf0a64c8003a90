"""Simulated replicas: a pod's engine queue, running batch and lifecycle, tick by tick."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from bench.scaling.config import Scenario
from bench.scaling.model import EngineModel


class Timing:
    """EngineModel figures the inner loop reads, looked up once."""

    __slots__ = ("d0", "d1", "decode_tokens", "limit", "per_token", "prompt")

    def __init__(self, model: EngineModel) -> None:
        self.limit = model.admit_limit
        self.prompt = float(model.prompt_tokens)
        self.per_token = model.prefill_s_per_token
        self.decode_tokens = model.output_tokens - 1
        self.d0 = model.decode_step_s
        self.d1 = model.decode_s_per_seq


class Pod:
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

    def advance(self, now: float, dt: float, timing: Timing, first_tokens: list[float]) -> None:
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
    pod, timing = Pod("replica", 0.0, 0.0), Timing(model)
    first: list[float] = []
    ticks, warm = tick_count(seconds, tick_s), tick_count(seconds / 6, tick_s)
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


def poisson_arrivals(scenario: Scenario, seed: int, tick_s: float) -> list[float]:
    """Sorted arrival times: per tick, Poisson(rate x tick) arrivals spread uniformly in it."""
    rng = np.random.default_rng(seed)
    ticks = tick_count(scenario.duration_s, tick_s)
    starts = np.arange(ticks) * tick_s
    rates = np.array([scenario.rate(t + tick_s / 2) for t in starts])
    counts = rng.poisson(rates * tick_s)
    times = np.repeat(starts, counts) + rng.uniform(0.0, tick_s, int(counts.sum()))
    return [float(t) for t in np.sort(times)]


def tick_count(seconds: float, tick_s: float) -> int:
    return max(1, round(seconds / tick_s))
