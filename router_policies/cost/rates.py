"""A replica's speed, learned online from the TTFTs the gateway observes there.

Model: ttft = step_s + prefill_s_per_token x tokens + decode_s_per_seq x running, where
``tokens`` is the prefill work the request met (its own uncached tokens plus those queued
ahead of it) and ``running`` the sequences decoding beside it. Exponentially weighted
recursive least squares fits the three rates per replica: O(1) per observation, forgetting
old samples so that a replica that slows down (or a heterogeneous fleet) is tracked. Until
``min_samples`` observations the policy's defaults apply, so a new replica is neither
favoured nor shunned by noise.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from router_policies.value import value

if TYPE_CHECKING:
    from router_policies.schema import CostSettings

_TOKEN_SCALE = 1e-3
"""Regressors are kept near 1 (thousands of tokens, tens of sequences) for numerical health."""
_SEQ_SCALE = 1e-1
_MIN_PREFILL = 1e-8
"""Floors: a fit never yields a free (or negative) cost, whatever the noise."""
_MIN_STEP = 1e-5


@value
class Rates:
    """Seconds per unit of work on one replica."""

    prefill_s_per_token: float
    step_s: float
    """Fixed cost of the engine step that produces the first token."""
    decode_s_per_seq: float
    """Extra seconds per step for each sequence decoding in the same batch."""

    @property
    def prefill_tokens_per_s(self) -> float:
        return 1.0 / self.prefill_s_per_token


class RateLearner:
    """Exponentially weighted recursive least squares over (1, tokens, running) -> TTFT."""

    __slots__ = ("_max_trace", "_p", "_prior", "_theta", "forgetting", "min_samples", "samples")

    def __init__(self, prior: Rates, *, forgetting: float = 0.98, min_samples: int = 8) -> None:
        self._prior = prior
        self.forgetting = forgetting
        self.min_samples = min_samples
        self._start()

    def _start(self) -> None:
        prior = self._prior
        self.samples = 0
        self._theta = [
            prior.step_s,
            prior.prefill_s_per_token / _TOKEN_SCALE,
            prior.decode_s_per_seq / _SEQ_SCALE,
        ]
        # A weak prior: a handful of observations outweigh it.
        scale = [max(v, 1e-2) ** 2 * 100 for v in self._theta]
        self._p = [[scale[i] if i == j else 0.0 for j in range(3)] for i in range(3)]
        # Forgetting inflates P along directions the traffic never excites (every prompt the
        # same size, say) until it overflows: it is held at the prior's size.
        self._max_trace = sum(scale)

    def observe(self, tokens: float, running: float, ttft_s: float) -> None:
        if not (math.isfinite(tokens) and math.isfinite(running) and math.isfinite(ttft_s)):
            return
        x = (1.0, tokens * _TOKEN_SCALE, running * _SEQ_SCALE)
        p, theta, lam = self._p, self._theta, self.forgetting
        px = [p[i][0] * x[0] + p[i][1] * x[1] + p[i][2] * x[2] for i in range(3)]
        denom = lam + x[0] * px[0] + x[1] * px[1] + x[2] * px[2]
        gain = [v / denom for v in px]
        error = ttft_s - (theta[0] * x[0] + theta[1] * x[1] + theta[2] * x[2])
        for i in range(3):
            theta[i] += gain[i] * error
        # P is symmetric, so x'P = (Px)'.
        p = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(3)] for i in range(3)]
        trace = p[0][0] + p[1][1] + p[2][2]
        if trace > self._max_trace:
            shrink = self._max_trace / trace
            p = [[v * shrink for v in row] for row in p]
        self._p = p
        self.samples += 1
        if not all(math.isfinite(v) for v in (*theta, trace)):
            self._start()  # numerically lost: start again from the prior

    def retune(self, prior: Rates, *, forgetting: float, min_samples: int, learn: bool) -> None:
        """A reloaded policy's settings. Where the policy's rates are the ones in use (learning
        off, or too few samples yet), they are the new ones; learned rates are kept."""
        changed, learned = prior != self._prior, self.learned  # learned under the old count
        self._prior, self.forgetting, self.min_samples = prior, forgetting, min_samples
        if not learn or (changed and not learned):
            self._start()

    @property
    def learned(self) -> bool:
        return self.samples >= self.min_samples

    def rates(self) -> Rates:
        """The learned rates once there are enough samples, else the prior."""
        if not self.learned:
            return self._prior
        step, prefill, decode = self._theta
        return Rates(
            prefill_s_per_token=max(prefill * _TOKEN_SCALE, _MIN_PREFILL),
            step_s=max(step, _MIN_STEP),
            decode_s_per_seq=max(decode * _SEQ_SCALE, 0.0),
        )


def default_rates(cost: CostSettings) -> Rates:
    """The rates a replica is assumed to have until it has taught its own: the policy's."""
    return Rates(1.0 / cost.prefill_tokens_per_s, cost.step_s, cost.decode_s_per_seq)
