"""The engine model: one continuous-batching vLLM replica as a fluid model, and the replica
count it says a load needs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from router_policies.schema import AutoscaleSettings

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
