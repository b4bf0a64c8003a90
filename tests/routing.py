"""Shared helpers of the routing-decision tests: a four-replica pool, prompts, snapshots of
its load, and a policy that has already sent some prompts somewhere."""

from __future__ import annotations

from router_policies.cost.rates import default_rates
from router_policies.cost.ttft import ReplicaLoad
from router_policies.decision import Candidate, Decision, PoolSnapshot
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures, fingerprint
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.rendezvous import hrw_score
from router_policies.schema import PoolPolicy

NAMES = ("a", "b", "c", "d")
POOL = PoolPolicy(model="m", replicas=[f"http://{n}:1" for n in NAMES])
BLOCK = POOL.prefix.block_bytes
RATES = default_rates(POOL.cost)


def system_prompt(text: bytes) -> CanonicalPrompt:
    """A prompt that is all shared lead (a system prompt), the case a home is for."""
    return CanonicalPrompt(text, lead_bytes=len(text))


def features(prompt: CanonicalPrompt) -> RequestFeatures:
    return fingerprint("m", prompt, POOL.prefix.layout, POOL.prefix.max_blocks)


# 20 blocks of system prompt (~640 tokens at 4 bytes a token).
FEATURES = features(system_prompt(b"s" * BLOCK * 20))
# The same length, but only its first block is a shared lead: mostly unique text.
MOSTLY_UNIQUE = features(CanonicalPrompt(b"u" * BLOCK * 20, lead_bytes=BLOCK))


def rendezvous(key: int) -> list[str]:
    """The replicas in the key's rendezvous order (highest random weight first)."""
    return sorted(NAMES, key=lambda n: hrw_score(key, n), reverse=True)


HOME, SECOND, *_ = rendezvous(FEATURES.home_key)


def candidate(name: str, **load: float) -> Candidate:
    recent = load.pop("recent", 0.0)
    inflight = int(load.get("running", 0))
    return Candidate(name, inflight, ReplicaLoad(**load), RATES, recent)  # type: ignore[arg-type]


def snapshot(*candidates: Candidate, now: float = 0.0) -> PoolSnapshot:
    given = {c.name for c in candidates}
    rest = tuple(candidate(n) for n in NAMES if n not in given)
    return PoolSnapshot((*candidates, *rest), now=now)


def holding(
    *replicas: str, request: RequestFeatures = FEATURES, pool: PoolPolicy = POOL
) -> PrefixAware:
    """A prefix policy that has sent ``request`` to each of ``replicas`` before."""
    policy = PrefixAware(pool)
    for name in replicas:
        decision = policy.select(request, snapshot())
        assert decision is not None
        policy.record(request, type(decision)(name, decision.route), now=0.0)
    return policy


def choose(
    policy: PrefixAware, snap: PoolSnapshot, request: RequestFeatures = FEATURES
) -> Decision:
    decision = policy.select(request, snap, explain=True)
    assert decision is not None
    return decision
