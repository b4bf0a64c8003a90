"""The routing decision, as plain tables of (pool snapshot, request) -> (replica, route)."""

from __future__ import annotations

import pytest

from router_policies.decision import Candidate, PoolSnapshot, Route
from router_policies.fingerprint import CanonicalPrompt, fingerprint
from router_policies.policies import REGISTRY
from router_policies.rendezvous import hrw_score
from router_policies.schema import PolicyName, PoolPolicy

POOL = PoolPolicy(model="m", replicas=["http://a:1", "http://b:1", "http://c:1", "http://d:1"])
NAMES = ("a", "b", "c", "d")
prefix_aware = REGISTRY[PolicyName.PREFIX_AWARE]


def system_prompt(text: bytes) -> CanonicalPrompt:
    """A prompt that is all shared lead (a system prompt), the case a cold home is for."""
    return CanonicalPrompt(text, lead_bytes=len(text))


# A prompt of 10 blocks at the default block size.
FEATURES = fingerprint("m", system_prompt(b"s" * POOL.prefix.block_bytes * 10), 128, 256)
# The same length, but only its first block is a shared lead: mostly unique text.
MOSTLY_UNIQUE = fingerprint(
    "m",
    CanonicalPrompt(b"u" * POOL.prefix.block_bytes * 10, lead_bytes=POOL.prefix.block_bytes),
    128,
    256,
)


def home(key: int, names: tuple[str, ...]) -> str:
    """The rendezvous home: the replica with the highest random weight for the key."""
    return max(names, key=lambda n: hrw_score(key, n))


HOME = home(FEATURES.home_key, NAMES)
NOT_HOME = next(n for n in NAMES if n != HOME)


def snapshot(loads: dict[str, float], matches: dict[str, int] | None = None) -> PoolSnapshot:
    matches = matches or {}
    return PoolSnapshot(tuple(Candidate(n, loads[n], matches.get(n, 0)) for n in loads))


def idle(**overrides: float) -> dict[str, float]:
    return {n: overrides.get(n, 0.0) for n in NAMES}


# fmt: off
CASES = [
    ("a full match wins on an idle pool", idle(), {"c": 10}, "c", Route.PREFIX_HIT),
    ("the longest match wins", idle(), {"b": 6, "c": 9}, "c", Route.PREFIX_HIT),
    ("a match counts while under the cap", idle(c=2, a=2, b=2), {"c": 10}, "c", Route.PREFIX_HIT),
    ("over the cap, the next-longest match under it", idle(c=5), {"c": 10, "b": 6}, "b", Route.PREFIX_HIT),
    ("a short match is not worth pinning: home", idle(), {NOT_HOME: 2}, HOME, Route.PREFIX_HOME),
    ("no match anywhere: the rendezvous home", idle(), {}, HOME, Route.PREFIX_HOME),
]
# fmt: on


@pytest.mark.parametrize(("case", "loads", "matches", "replica", "route"), CASES)
def test_prefix_aware_decision(
    case: str,
    loads: dict[str, float],
    matches: dict[str, int],
    replica: str,
    route: Route,
) -> None:
    decision = prefix_aware.select(FEATURES, snapshot(loads, matches), POOL)
    assert decision is not None, case
    assert (decision.replica, decision.route) == (replica, route), case


def test_busy_home_falls_back_to_the_least_loaded_replica() -> None:
    loads = idle(**{HOME: 4.0, NOT_HOME: 0.0})
    for n in NAMES:
        if n not in (HOME, NOT_HOME):
            loads[n] = 1.0
    decision = prefix_aware.select(FEATURES, snapshot(loads), POOL)
    assert decision is not None
    assert (decision.replica, decision.route) == (NOT_HOME, Route.LEAST_LOADED)


def test_a_mostly_unique_prompt_goes_by_load_not_to_a_home() -> None:
    """Preble's rule: when the shared part is small, a cache saves little; balance wins."""
    home_of_lead = home(MOSTLY_UNIQUE.home_key, NAMES)
    loads = {n: 1.0 for n in NAMES}
    emptiest = next(n for n in NAMES if n != home_of_lead)
    loads[emptiest] = 0.0
    decision = prefix_aware.select(MOSTLY_UNIQUE, snapshot(loads, {home_of_lead: 1}), POOL)
    assert decision is not None
    assert (decision.replica, decision.route) == (emptiest, Route.LEAST_LOADED)


def test_equal_matches_go_to_the_less_loaded_replica() -> None:
    decision = prefix_aware.select(FEATURES, snapshot(idle(a=1), {"a": 10, "b": 10}), POOL)
    assert decision is not None
    assert (decision.replica, decision.route) == ("b", Route.PREFIX_HIT)


def test_the_cap_follows_the_balance_factor() -> None:
    # Loads 3,0,0,0: mean after placing is 1, so the cap is (1+eps)*1 + 1.
    loads = idle(a=3)
    tight = POOL.model_copy(update={"load": POOL.load.model_copy(update={"balance_eps": 0.25})})
    loose = POOL.model_copy(update={"load": POOL.load.model_copy(update={"balance_eps": 2.5})})
    on_tight = prefix_aware.select(FEATURES, snapshot(loads, {"a": 10}), tight)
    on_loose = prefix_aware.select(FEATURES, snapshot(loads, {"a": 10}), loose)
    assert on_tight is not None and on_tight.replica != "a"
    assert on_loose is not None and (on_loose.replica, on_loose.route) == ("a", Route.PREFIX_HIT)


def test_distinct_prefixes_spread_over_the_pool() -> None:
    homes = set()
    for i in range(64):
        features = fingerprint(
            "m", system_prompt(f"system prompt number {i} ".encode() * 20), 128, 256
        )
        decision = prefix_aware.select(features, snapshot(idle()), POOL)
        assert decision is not None and decision.route is Route.PREFIX_HOME
        homes.add(decision.replica)
    assert homes == set(NAMES)


def test_sticky_under_a_stream_of_dispatches() -> None:
    """Replaying dispatch bookkeeping: one prefix keeps its replica while the pool stays balanced."""
    loads = idle(a=2, b=2, c=2, d=2)
    matches: dict[str, int] = {}
    chosen = []
    for _ in range(5):
        decision = prefix_aware.select(FEATURES, snapshot(loads, matches), POOL)
        assert decision is not None
        chosen.append(decision.replica)
        matches[decision.replica] = 10
        # Each request finishes before the next: load is unchanged.
    assert len(set(chosen)) == 1


def test_a_hot_prefix_spills_once_its_replica_hits_the_cap() -> None:
    """Concurrent requests on one prefix: pinning never piles them onto one replica."""
    loads = idle()
    matches: dict[str, int] = {}
    for _ in range(40):
        decision = prefix_aware.select(FEATURES, snapshot(loads, matches), POOL)
        assert decision is not None
        loads[decision.replica] += 1
        matches[decision.replica] = 10
    mean = sum(loads.values()) / len(loads)
    assert max(loads.values()) <= (1 + POOL.load.balance_eps) * mean + 1


def test_no_candidate_gives_no_decision() -> None:
    for name in PolicyName:
        assert REGISTRY[name].select(FEATURES, PoolSnapshot(()), POOL) is None


def test_unhealthy_replicas_are_never_chosen() -> None:
    # The snapshot carries healthy replicas only; a match on a missing replica is meaningless.
    only_b = PoolSnapshot((Candidate("b", 7.0, 0),))
    for name in PolicyName:
        decision = REGISTRY[name].select(FEATURES, only_b, POOL)
        assert decision is not None and decision.replica == "b"


def test_least_loaded_baseline_ignores_matches() -> None:
    decision = REGISTRY[PolicyName.LEAST_LOADED].select(
        FEATURES, snapshot(idle(a=1, b=0, c=1, d=1), {"a": 10}), POOL
    )
    assert decision is not None and (decision.replica, decision.route) == ("b", Route.LEAST_LOADED)


def test_least_loaded_ties_follow_the_prefix_not_the_list_order() -> None:
    decision = REGISTRY[PolicyName.LEAST_LOADED].select(FEATURES, snapshot(idle()), POOL)
    assert decision is not None and decision.replica == HOME


def test_round_robin_cycles_through_candidates() -> None:
    rr = REGISTRY[PolicyName.ROUND_ROBIN]
    picks = []
    for i in range(8):
        snap = PoolSnapshot(tuple(Candidate(n, 0.0) for n in NAMES), dispatched=i)
        decision = rr.select(FEATURES, snap, POOL)
        assert decision is not None and decision.route is Route.ROUND_ROBIN
        picks.append(decision.replica)
    assert picks == list(NAMES) * 2
