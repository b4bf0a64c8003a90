"""Simulated replicas: a pod's engine queue, running batch and lifecycle, tick by tick."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

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


Hook = Callable[[Any, float], None]
"""Called with a request's payload and a time: its first token, or its end."""


def _ignore(payload: Any, at: float) -> None:
    pass


class Pod:
    """One replica: the engine's waiting queue, its running requests, and its pod lifecycle.

    Each request is (arrival time, payload): the payload is what the gateway booked at dispatch,
    handed back to the hooks at its first token and at its end, as a live gateway sees them."""

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
        "serial",
        "waiting",
    )

    def __init__(self, name: str, created_s: float, ready_s: float) -> None:
        self.name = name
        self.created_s = created_s
        self.ready_s = ready_s
        self.healthy = False
        self.draining = False
        self.waiting: deque[tuple[float, Any]] = deque()
        """(arrival time, payload) of the requests in the engine's waiting queue."""
        self.prefill: deque[list[Any]] = deque()
        """[arrival time, prompt tokens left, payload] of admitted requests still in prefill."""
        self.decoding: list[tuple[float, int, Any]] = []
        """Heap of (decode clock value at which it finishes, serial, payload)."""
        self.serial = 0
        self.clock = 0.0
        """Decode steps taken so far: every decoding request gains one token per step."""
        self.running = 0
        self.inflight = 0
        """Requests the gateway sent here and not yet finished (waiting + running)."""

    def kv_usage(self, model: EngineModel) -> float:
        return self.running * model.tokens_per_request / model.kv_capacity_tokens

    def advance(
        self,
        now: float,
        dt: float,
        timing: Timing,
        first_tokens: list[float],
        on_first: Hook = _ignore,
        on_end: Hook = _ignore,
    ) -> None:
        """Run the engine from ``now`` for dt seconds: admit, prefill in arrival order, then
        decode steps.

        Chunked prefill mixes prompt chunks into decode steps; over a tick the GPU time is
        the same as prefilling first and decoding in the rest, which is what this does. A
        request's first token comes out of the step that finishes its prefill, which also
        decodes the running batch: its TTFT includes one decode step of that batch.
        """
        waiting, prefill = self.waiting, self.prefill
        while waiting and self.running < timing.limit:
            arrival, payload = waiting.popleft()
            prefill.append([arrival, timing.prompt, payload])
            self.running += 1
        cursor = 0.0
        per_token = timing.per_token
        decoding = self.decoding
        while prefill:
            item = prefill[0]
            need = item[1] * per_token
            if cursor + need > dt:
                item[1] -= (dt - cursor) / per_token
                cursor = dt
                break
            cursor += need
            prefill.popleft()
            first = now + cursor + timing.d0 + timing.d1 * len(decoding)
            first_tokens.append(item[0])
            first_tokens.append(first)
            on_first(item[2], first)
            self.serial += 1
            heapq.heappush(decoding, (self.clock + timing.decode_tokens, self.serial, item[2]))
        if decoding and cursor < dt:
            self.clock += (dt - cursor) / (timing.d0 + timing.d1 * len(decoding))
            done = 0
            while decoding and decoding[0][0] <= self.clock + 1e-9:
                on_end(heapq.heappop(decoding)[2], now + dt)
                done += 1
            self.running -= done
            self.inflight -= done

    def held(self) -> list[float]:
        """Arrival times of the requests here that have no first token yet."""
        return [*(arrival for arrival, _ in self.waiting), *(item[0] for item in self.prefill)]


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
            pod.waiting.append((arrivals[upcoming], None))
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
