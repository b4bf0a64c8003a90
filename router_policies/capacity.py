"""A replica's capacity in requests/s, estimated from its learned speed before it has ever been
saturated, so the autoscaling signal has a target rate from the first completed requests.

A continuous-batching engine running ``n`` sequences spends, per request, ``P x prefill_s``
of the whole GPU on its uncached prompt (a prefill chunk stalls every sequence's step), and
``S`` decode steps of ``step_s + n x decode_s_per_seq`` shared by the ``n`` sequences. At a
full batch it therefore completes

    r = n / (n x P x prefill_s_per_token + S x (step_s + n x decode_s_per_seq))

requests per second (the fluid model of docs/scaling.md). The rates are the cost model's,
learned per replica from observed TTFTs (router_policies/cost/rates.py); ``P`` and ``S`` are
the pool's observed means; ``n`` is the batch size the replica's queue has shown, else the
configured ``AutoscaleSettings.batch_slots``, and never more sequences than the KV cache holds
under ``kv_usage_ceiling``. Plain values in and out; the measured saturation capacity
(router_policies/autoscale.py ``CapacityMeter``) replaces the estimate once it exists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from router_policies.cost.rates import Rates


@dataclass(frozen=True, slots=True)
class Workload:
    """The pool's mean request, as the gateway observes it."""

    prompt_tokens: float
    """Uncached prompt tokens a replica prefills per request."""
    decode_s: float
    """Seconds from a request's first token to its end..."""
    decode_running: float
    """...with this many sequences in its replica's batch (at its dispatch)."""


def decode_steps(workload: Workload, rates: Rates) -> float:
    """Decode steps per request (output tokens - 1): its decode time over the step time at its
    batch. The output length, without reading the output."""
    step = rates.step_s + max(workload.decode_running, 0.0) * rates.decode_s_per_seq
    return max(workload.decode_s, 0.0) / step if step > 0 else 0.0


def batch_size(
    slots: float,
    fallback: int,
    kv_tokens_per_request: float,
    kv_capacity_tokens: float | None = None,
    kv_usage_ceiling: float = 1.0,
) -> float:
    """Sequences the replica runs at once when saturated: the batch its queue has shown
    (``slots``, inf while unknown) else ``fallback``, at most what fits in
    ``kv_usage_ceiling`` of its KV cache, and at least one."""
    n = slots if math.isfinite(slots) and slots > 0 else float(fallback)
    if kv_capacity_tokens:
        n = min(n, kv_usage_ceiling * kv_capacity_tokens / max(kv_tokens_per_request, 1.0))
    return max(n, 1.0)


def kv_tokens(workload: Workload, rates: Rates) -> float:
    """KV-cache tokens a running request holds at its end: its uncached prompt (cached prefix
    blocks are shared) and its output."""
    return workload.prompt_tokens + decode_steps(workload, rates) + 1


def full_batch_capacity(rates: Rates, batch: float, workload: Workload) -> float:
    """Requests/s one replica completes with ``batch`` sequences running (formula above)."""
    n = max(batch, 1.0)
    prefill = n * workload.prompt_tokens * rates.prefill_s_per_token
    decode = decode_steps(workload, rates) * (rates.step_s + n * rates.decode_s_per_seq)
    seconds = prefill + decode
    return n / seconds if seconds > 0 else math.inf


class WorkloadMeter:
    """Exponentially weighted means of the pool's uncached prompt tokens, decode seconds and
    batch at dispatch per request (each finished request weighs ``weight``: about the last
    1/weight count), known once ``min_samples`` decodes were seen. Times, not steps, are kept:
    steps depend on the learned rates, which are read when the estimate is made."""

    __slots__ = ("_prompt", "_running", "_seconds", "decodes", "min_samples", "weight")

    def __init__(self, weight: float = 0.02, min_samples: int = 8) -> None:
        self.weight = weight
        self.min_samples = min_samples
        self.decodes = 0
        self._prompt: float | None = None
        self._seconds: float | None = None
        self._running: float | None = None

    def observe(self, prompt_tokens: float, decode_s: float | None, running: float) -> None:
        """One finished request; ``decode_s`` None when its decode was not seen (not streamed)."""
        if math.isfinite(prompt_tokens) and prompt_tokens >= 0:
            self._prompt = _ewma(self._prompt, prompt_tokens, self.weight)
        if decode_s is not None and math.isfinite(decode_s) and decode_s >= 0:
            self._seconds = _ewma(self._seconds, decode_s, self.weight)
            self._running = _ewma(self._running, max(running, 0.0), self.weight)
            self.decodes += 1

    def value(self) -> Workload | None:
        if self._prompt is None or self._seconds is None or self._running is None:
            return None
        if self.decodes < self.min_samples:
            return None
        return Workload(self._prompt, self._seconds, self._running)


def _ewma(mean: float | None, sample: float, weight: float) -> float:
    return sample if mean is None else mean + weight * (sample - mean)


class CapacityEstimate:
    """The pool's per-replica capacity: its replicas' mean estimate, smoothed, and refreshed
    only after ``quiet_s`` without saturation. Under saturation the TTFTs the rates are learned
    from include the wait for a batch slot, which the rate model reads as slower prefill and
    steps; the rates take a few dozen requests to forget it. Meanwhile the last estimate holds
    (and the measured capacity takes over once the saturation has lasted its window)."""

    __slots__ = ("_saturated_at", "quiet_s", "value", "weight")

    def __init__(self, quiet_s: float = 30.0, weight: float = 0.2) -> None:
        self.quiet_s = quiet_s
        self.weight = weight
        self.value: float | None = None
        self._saturated_at = -math.inf

    def update(
        self, now: float, replica_capacities: Iterable[float], saturated: bool
    ) -> float | None:
        if saturated:
            self._saturated_at = now
        if now - self._saturated_at < self.quiet_s and self.value is not None:
            return self.value
        finite = [c for c in replica_capacities if math.isfinite(c) and c > 0]
        if finite:
            self.value = _ewma(self.value, sum(finite) / len(finite), self.weight)
        return self.value
