"""The input and output of a routing decision: plain values, so decisions are pure and testable."""

from __future__ import annotations

from enum import StrEnum

from router_policies.cost.rates import Rates
from router_policies.cost.ttft import IDLE, ReplicaLoad, TtftEstimate
from router_policies.value import value


class Route(StrEnum):
    """Why a replica was chosen; sent to clients as x-gateway-route (CONTRACT)."""

    PREFIX_HIT = "prefix-hit"
    """The fastest replica holds a useful part of the prompt."""
    PREFIX_HOME = "prefix-home"
    """A prompt whose shared lead is worth a home went to one: the least recently loaded
    replica for a new prefix (several for a hot prefix)."""
    LEAST_LOADED = "least-loaded"
    """The prefix did not matter: the fastest, least-loaded replica."""
    ROUND_ROBIN = "round-robin"
    LATE = "late"
    """Every replica was predicted to miss the pool's TTFT objective: sent to the one already
    furthest behind, so the others stay within it."""
    SESSION = "session"
    """The replica the client's session (x-session-id, prompt_cache_key, user) last went to,
    not predicted slower than a cold start elsewhere."""
    OVERFLOW = "overflow"
    """A tiered request sent to the other pool because its own was saturated."""
    CLOSE_CALL = "close-call"
    """A tiered request scored within the tiers' close_call_margin of the threshold, sent to
    the other tier's pool because it would wait less there for that pool's speed."""
    PINNED = "pinned"
    """The one replica that holds the stored response the request names (a /v1/responses
    follow-up's previous_response_id, a retrieve or a cancel)."""


@value
class Candidate:
    """A healthy replica as the router sees it at dispatch time."""

    name: str
    inflight: int = 0
    """Requests this gateway has in flight there (counted at dispatch)."""
    load: ReplicaLoad = IDLE
    rates: Rates | None = None
    """Its learned speed (policies that need it); None for those that do not."""
    recent: float = 0.0
    """Requests dispatched there lately (a decayed count): the balance rule's measure."""
    held_bytes: int | None = None
    """Bytes of this request's canonical prompt its engine holds, or will once the requests in
    flight there are prefilled, known from its KV-cache events; None: the policy's own
    estimate stands."""

    @property
    def queue(self) -> float:
        """In-flight plus the engine's scraped waiting queue: the baselines' load figure."""
        return self.inflight + self.load.engine_waiting


@value
class PoolSnapshot:
    candidates: tuple[Candidate, ...]
    """Healthy replicas not yet tried for this request, in the pool's configured order."""
    dispatched: int = 0
    """Requests the pool has dispatched so far: round-robin's cursor."""
    now: float = 0.0
    """Monotonic seconds: the clock of the decayed counts."""
    chars_per_token: float = 4.0
    """Bytes of canonical prompt per model token, as learned for the pool's model."""


@value
class CandidateCost:
    """One candidate's part in a cost-model decision, for explanations (/admin/route)."""

    name: str
    matched_blocks: int
    uncached_tokens: float
    estimate: TtftEstimate
    recent: float
    rates: Rates


@value
class Decision:
    replica: str
    route: Route
    matched_blocks: int = 0
    uncached_tokens: float = 0.0
    """Prompt tokens the chosen replica is expected to prefill (0 where unknown)."""
    estimate: TtftEstimate | None = None
    """The chosen replica's predicted TTFT (cost-model policies)."""
    costs: tuple[CandidateCost, ...] = ()
    """Every candidate's prediction (cost-model policies)."""
