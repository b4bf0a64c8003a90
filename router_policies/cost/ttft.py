"""One replica's predicted time to first token for one request, in seconds, term by term."""

from __future__ import annotations

import math

from router_policies.cost.rates import Rates
from router_policies.value import value


@value
class ReplicaLoad:
    """What is known of a replica's work at dispatch time."""

    pending_prefill_tokens: float = 0.0
    """Uncached prompt tokens of the requests this gateway sent there that have not produced a
    first byte yet: prefill work the engine does before (or alongside) a new request's."""
    pending_requests: int = 0
    """How many requests those are."""
    running: float = 0.0
    """Sequences in the engine's batch: the larger of the scraped figure and this gateway's
    own in-flight count (scrapes lag; dispatches do not)."""
    engine_waiting: float = 0.0
    """The engine's own waiting queue, as last scraped (it also holds other gateways' work)."""
    requests: float = 0.0
    """Requests there, running or waiting: the larger of the scraped and the dispatched count."""
    slots: float = math.inf
    """Sequences the engine runs at once, as seen while it had a queue (unknown: unbounded)."""
    service_s: float = 0.0
    """How long a request stays there, from dispatch to its end, on average lately."""


IDLE = ReplicaLoad()


@value
class TtftEstimate:
    slot_s: float
    """Waiting for a place in a full batch: the requests ahead of it beyond the engine's
    slots, each freeing one after a request's time there."""
    wait_s: float
    """Prefill work queued ahead of this request on the replica."""
    prefill_s: float
    """This request's own uncached tokens."""
    step_s: float
    """The engine step that emits the first token, slowed by the sequences decoding in it."""

    @property
    def total_s(self) -> float:
        return self.slot_s + self.wait_s + self.prefill_s + self.step_s


def queued_tokens(load: ReplicaLoad, prompt_tokens: float) -> float:
    """Prefill tokens ahead of a new request. Requests in the engine's queue that this gateway
    did not send (another instance's, or ones a stale scrape still shows) are counted as long
    as this prompt: the best guess without their prompts."""
    unknown = max(load.engine_waiting - load.pending_requests, 0.0)
    return load.pending_prefill_tokens + unknown * prompt_tokens


def full_batch(requests_before: float, slots: float) -> bool:
    """Whether a request that found ``requests_before`` requests on a replica of ``slots`` met a
    full batch, and waited for a slot. Its TTFT is then mostly that wait, which ``slot_wait_s``
    predicts and the learned rates must not absorb: learned from such requests under overload,
    prefill rose from 100 us to 5 ms a token, every cold copy was charged seconds and warm
    replicas kept their queues while others idled. Judged with the slots known when it ends:
    the first requests of an overload are sent before the scrapes have seen a full batch."""
    return requests_before >= slots


def slot_wait_s(load: ReplicaLoad) -> float:
    """A decode-bound engine's queue: slots free at slots / service_s requests a second."""
    beyond = load.requests + 1 - load.slots
    return beyond * load.service_s / load.slots if beyond > 0 else 0.0


def predicted_s(
    load: ReplicaLoad, uncached_tokens: float, prompt_tokens: float, rates: Rates
) -> float:
    """``estimate(...).total_s`` without building the parts: the decision's inner loop."""
    work = queued_tokens(load, prompt_tokens) + uncached_tokens
    return (
        slot_wait_s(load)
        + work * rates.prefill_s_per_token
        + rates.step_s
        + rates.decode_s_per_seq * load.running
    )


def estimate(
    load: ReplicaLoad, uncached_tokens: float, prompt_tokens: float, rates: Rates
) -> TtftEstimate:
    per_token = rates.prefill_s_per_token
    return TtftEstimate(
        slot_s=slot_wait_s(load),
        wait_s=queued_tokens(load, prompt_tokens) * per_token,
        prefill_s=uncached_tokens * per_token,
        step_s=rates.step_s + rates.decode_s_per_seq * load.running,
    )
