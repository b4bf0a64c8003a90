"""The routing decision as a specification: (request, pool snapshot, what the policy has seen)
-> (replica, route), with each replica's predicted time to first token as the reason."""

from __future__ import annotations

import pytest

from router_policies.cost.rates import Rates
from router_policies.cost.ttft import ReplicaLoad
from router_policies.decision import Candidate, Decision, PoolSnapshot, Route
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures, load_only
from router_policies.policies import make_policy
from router_policies.policies.prefix_aware import PrefixAware
from router_policies.schema import PolicyName, PoolPolicy
from tests.routing import (
    BLOCK,
    FEATURES,
    HOME,
    MOSTLY_UNIQUE,
    NAMES,
    POOL,
    RATES,
    SECOND,
    candidate,
    choose,
    features,
    holding,
    rendezvous,
    snapshot,
    system_prompt,
)

# --- the cost model's verdicts ---------------------------------------------------------------


def test_a_cold_prefix_goes_to_its_rendezvous_home() -> None:
    decision = choose(PrefixAware(POOL), snapshot())
    assert (decision.replica, decision.route) == (HOME, Route.PREFIX_HOME)


def test_the_replica_holding_the_prefix_wins_and_says_so() -> None:
    decision = choose(holding("c"), snapshot())
    assert (decision.replica, decision.route) == ("c", Route.PREFIX_HIT)
    assert decision.matched_blocks == len(FEATURES.block_hashes)
    assert decision.uncached_tokens == 0


def test_the_longest_match_wins() -> None:
    short = features(system_prompt(b"s" * BLOCK * 12))
    policy = holding("b", request=short)
    policy.record(FEATURES, type(choose(policy, snapshot()))("c", Route.PREFIX_HIT), now=0.0)
    decision = choose(policy, snapshot())
    assert decision.replica == "c"


def test_a_burst_of_hits_stays_home() -> None:
    """Ten requests already decoding there cost one slower step, not a cold prefill."""
    policy = holding(HOME)
    busy_home = candidate(HOME, running=10, recent=10)
    decision = choose(policy, snapshot(busy_home))
    assert (decision.replica, decision.route) == (HOME, Route.PREFIX_HIT)


def test_a_queue_on_the_home_sends_the_next_request_to_a_warm_second_replica() -> None:
    policy = holding(HOME, SECOND)
    queued_home = candidate(HOME, pending_prefill_tokens=8000, pending_requests=4, running=4)
    decision = choose(policy, snapshot(queued_home))
    assert (decision.replica, decision.route) == (SECOND, Route.PREFIX_HIT)


def test_a_queue_on_the_home_is_still_better_than_a_cold_prefill_if_it_is_short() -> None:
    policy = holding(HOME)
    short_queue = candidate(HOME, pending_prefill_tokens=50, pending_requests=1, running=1)
    assert choose(policy, snapshot(short_queue)).replica == HOME


def test_a_long_queue_on_the_home_sends_even_a_cold_prefill_elsewhere() -> None:
    policy = holding(HOME)
    long_queue = candidate(HOME, pending_prefill_tokens=50_000, pending_requests=20, running=16)
    decision = choose(policy, snapshot(long_queue))
    assert decision.replica != HOME
    assert decision.uncached_tokens == pytest.approx(FEATURES.hashed_bytes / 4)


def test_a_full_batch_on_the_home_sends_the_next_request_to_a_warm_replica_with_room() -> None:
    policy = holding(HOME, SECOND)
    full = candidate(HOME, running=4, requests=9, slots=4, service_s=3.0)
    room = candidate(SECOND, running=2, requests=2, slots=4, service_s=3.0)
    assert choose(policy, snapshot(full, room)).replica == SECOND


def test_a_decoding_only_replica_is_not_busy() -> None:
    """One replica decodes twelve sequences, another prefills one long prompt: a new unique
    prompt goes to the one that is only decoding."""
    others = [n for n in NAMES if n not in ("a", "b")]
    decoding = candidate("a", running=12, recent=12)
    prefilling = candidate("b", pending_prefill_tokens=4000, pending_requests=1, running=1)
    busy = [
        candidate(n, pending_prefill_tokens=4000, pending_requests=1, running=1) for n in others
    ]
    decision = choose(PrefixAware(POOL), snapshot(decoding, prefilling, *busy), MOSTLY_UNIQUE)
    assert (decision.replica, decision.route) == ("a", Route.LEAST_LOADED)


def test_the_engine_queue_of_other_gateways_counts_as_wait() -> None:
    policy = holding(HOME, SECOND)
    home_queued_elsewhere = candidate(HOME, engine_waiting=30, running=16)
    assert choose(policy, snapshot(home_queued_elsewhere)).replica == SECOND


def test_a_slower_replica_gets_the_cold_prefill_only_when_the_fast_one_is_busy() -> None:
    slow = Rates(RATES.prefill_s_per_token * 2, RATES.step_s, RATES.decode_s_per_seq)
    cands = [Candidate(n, 0, ReplicaLoad(), slow if n != "c" else RATES) for n in NAMES]
    decision = choose(PrefixAware(POOL), PoolSnapshot(tuple(cands)), MOSTLY_UNIQUE)
    assert decision.replica == "c"


# --- the balance rule among equally fast replicas ----------------------------------------------


def test_a_cold_prefix_goes_to_the_least_recently_loaded_replica_not_a_busy_home() -> None:
    """A fixed hash order would stack two popular prefixes on one replica by chance: a new
    prefix starts where the fewest requests went lately, its rendezvous order breaking ties."""
    busy_home = candidate(HOME, recent=1)
    decision = choose(PrefixAware(POOL), snapshot(busy_home))
    assert (decision.replica, decision.route) == (SECOND, Route.PREFIX_HOME)


def test_prefixes_arriving_one_after_another_fill_the_pool_evenly() -> None:
    """Each new prefix is placed where the fewest requests went: four prefixes, four replicas,
    whatever their hashes, and the fifth shares the least loaded one."""
    policy = PrefixAware(POOL)
    recent = dict.fromkeys(NAMES, 0.0)
    placed = []
    for i in range(5):
        request = features(system_prompt(f"prefix {i} ".encode() * 200))
        snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in recent.items()))
        decision = choose(policy, snap, request)
        placed.append(decision.replica)
        recent[decision.replica] += 10.0 - i  # earlier prefixes are the more popular
    assert sorted(placed[:4]) == sorted(NAMES)
    assert placed[4] == placed[3]


def test_a_mostly_unique_prompt_goes_to_the_least_recently_loaded_replica() -> None:
    """Preble's rule: a cache saves little when the shared part is small; balance wins."""
    recents = {n: 5.0 for n in NAMES}
    emptiest = rendezvous(MOSTLY_UNIQUE.home_key)[-1]
    recents[emptiest] = 1.0
    snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in recents.items()))
    decision = choose(PrefixAware(POOL), snap, MOSTLY_UNIQUE)
    assert (decision.replica, decision.route) == (emptiest, Route.LEAST_LOADED)


@pytest.mark.parametrize("asked_at", [0.0, 86400.0])
def test_a_prompt_of_its_own_text_goes_where_the_cache_took_the_least_new_text(
    asked_at: float,
) -> None:
    """ "a" had one long prompt and "b" three short ones: by request counts "a" is the quieter,
    but its cache took the more new text (evicting as much history), so a prompt no replica
    holds goes to "b", whose histories would otherwise be kept shorter. A day later too: the
    debt does not fade until the others have taken as much."""
    policy = PrefixAware(POOL)
    sent = {"a": [b"x" * BLOCK * 200], "b": [f"short {i} ".encode() * 40 for i in range(3)]}
    for name, prompts in sent.items():
        for text in prompts:
            request = features(CanonicalPrompt(text))
            policy.record(request, Decision(name, Route.LEAST_LOADED), now=0.0)
    snap = PoolSnapshot((candidate("a", recent=1.0), candidate("b", recent=3.0)), now=asked_at)
    decision = choose(policy, snap, features(CanonicalPrompt(b"q" * BLOCK * 20)))
    assert (decision.replica, decision.route) == ("b", Route.LEAST_LOADED)


def test_a_replica_joining_late_takes_new_text_only_until_its_cache_is_full() -> None:
    """ "d" joins a pool whose replicas have each taken ten caches' worth of text: it takes the
    prompts of their own text while it has free room, one cache's worth, and then its turn like
    the others, not the pool's whole past."""
    policy = PrefixAware(POOL)
    capacity = 64
    for name in NAMES:
        policy.size_index(name, capacity)

    def own_text(tag: str) -> RequestFeatures:
        return features(CanonicalPrompt(f"{tag} ".encode() * (BLOCK * 8 // len(tag))))

    for i in range(80):
        for name in ("a", "b", "c"):
            policy.record(own_text(f"{name} old {i}"), Decision(name, Route.LEAST_LOADED), 0.0)
    placed = []
    for i in range(24):
        request = own_text(f"new {i}")
        decision = choose(policy, snapshot(), request)
        policy.record(request, decision, 0.0)
        placed.append(decision.replica)
    first_others = next(i for i, name in enumerate(placed) if name != "d")
    assert 4 <= first_others <= 9  # a cache of 64 blocks holds 8 prompts of 8 blocks
    assert set(placed[first_others:]) == set(NAMES)


def test_distinct_prefixes_spread_over_the_pool() -> None:
    policy = PrefixAware(POOL)
    homes = set()
    for i in range(64):
        request = features(system_prompt(f"system prompt number {i} ".encode() * 20))
        decision = choose(policy, snapshot(), request)
        assert decision.route is Route.PREFIX_HOME
        homes.add(decision.replica)
    assert homes == set(NAMES)


def prefixes(count: int, tag: str) -> list[RequestFeatures]:
    return [features(system_prompt(f"{tag} prompt {i} ".encode() * 200)) for i in range(count)]


def holding_prefixes(policy: PrefixAware, replica: str, count: int, tag: str) -> None:
    """Sends ``count`` distinct system prompts to ``replica``, once each."""
    for request in prefixes(count, tag):
        decision = type(choose(policy, snapshot(), request))(replica, Route.PREFIX_HOME)
        policy.record(request, decision, 0.0)


@pytest.mark.parametrize(
    ("held", "recent", "placed_on"),
    [
        # As busy as each other: the new prefix goes where the fewest prefixes take room.
        ({"a": 6, "b": 3, "c": 2, "d": 1}, {"a": 2.0, "b": 2.0, "c": 2.0, "d": 2.0}, "d"),
        # "a" is quiet because its six prefixes are rare: "d" is busier but has the room.
        ({"a": 6, "b": 3, "c": 2, "d": 1}, {"a": 2.0, "b": 3.0, "c": 3.0, "d": 3.0}, "d"),
        # Room alone does not win: "d" is far busier than the others.
        ({"a": 2, "b": 2, "c": 2, "d": 1}, {"a": 1.0, "b": 3.0, "c": 3.0, "d": 20.0}, "a"),
    ],
)
def test_a_new_prefix_goes_where_load_and_prefixes_held_sum_least(
    held: dict[str, int], recent: dict[str, float], placed_on: str
) -> None:
    """By request counts alone, a replica quiet because its prefixes are rare would collect
    every new one, and its cache would evict them before their next request."""
    policy = PrefixAware(POOL)
    for replica, count in held.items():
        holding_prefixes(policy, replica, count, tag=replica)
    snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in recent.items()))
    new = features(system_prompt(b"a new system prompt " * 200))
    decision = choose(policy, snap, new)
    assert (decision.replica, decision.route) == (placed_on, Route.PREFIX_HOME)


def test_only_the_prefixes_a_replica_still_holds_take_room() -> None:
    """The room counted is the shared leads whose blocks the index still holds: a prefix the
    replica has evicted takes none."""
    small_index = POOL.prefix.model_copy(update={"index_blocks": 64})
    policy = PrefixAware(POOL.model_copy(update={"prefix": small_index}))
    holding_prefixes(policy, "a", 6, tag="a")
    sent = prefixes(6, tag="a")
    lead = POOL.prefix.layout.floor(sent[0].lead_bytes)
    held = [r for r in sent if policy.matched_blocks("a", r) > r.home_block]  # its whole lead
    assert 0 < len(held) < len(sent)  # the earliest were evicted
    assert policy.index_lead_bytes("a") == lead * len(held)


def test_sticky_under_a_stream_of_sequential_requests() -> None:
    policy = PrefixAware(POOL)
    chosen = []
    for i in range(20):
        decision = choose(policy, snapshot(now=float(i)))
        policy.record(FEATURES, decision, now=float(i))
        chosen.append(decision.replica)
    assert len(set(chosen)) <= 2, chosen  # its home, and a spread copy once it is all the traffic


# --- hot prefixes -----------------------------------------------------------------------------


def replay(policy: PrefixAware, requests: list[RequestFeatures]) -> dict[str, int]:
    """Dispatch requests one after another, as the gateway would, tracking recent loads."""
    recent = dict.fromkeys(NAMES, 0.0)
    counts = dict.fromkeys(NAMES, 0)
    for i, request in enumerate(requests):
        snap = PoolSnapshot(tuple(candidate(n, recent=recent[n]) for n in NAMES), now=i * 0.01)
        decision = choose(policy, snap, request)
        policy.record(request, decision, now=i * 0.01)
        recent[decision.replica] += 1
        counts[decision.replica] += 1
    return counts


def test_a_hot_prefix_is_spread_over_k_replicas_that_follow_its_share() -> None:
    """One prefix with half the traffic on four replicas: k = ceil(0.5 x 4 x 1.25) = 3, and
    more where the others are busier than the least loaded replica (the valley it fills)."""
    cold = [features(system_prompt(f"tenant {i} ".encode() * 40)) for i in range(40)]
    mixed = [r for pair in zip([FEATURES] * 40, cold, strict=True) for r in pair]
    policy = PrefixAware(POOL)
    counts = replay(policy, mixed)
    assert max(counts.values()) <= 1.25 * len(mixed) / len(NAMES), counts
    spread_to = {n for n in NAMES if policy.matched_blocks(n, FEATURES) > 0}
    assert len(spread_to) >= 3


def test_requests_without_a_prompt_to_cache_leave_the_prefixes_shares_as_they_were() -> None:
    # An app that counts tokens (/tokenize) before each call sends as many of those.
    policy = PrefixAware(POOL)
    decision = Decision(HOME, Route.PREFIX_HOME)
    for i in range(20):
        policy.record(FEATURES, decision, now=i * 0.01)
    before = policy.hot.share(FEATURES.home_key, 0.2, POOL.hot.min_requests)
    for _ in range(200):
        policy.record(load_only("m"), decision, now=0.2)
    assert policy.hot.share(FEATURES.home_key, 0.2, POOL.hot.min_requests) == before


EIGHT = tuple(f"r{i}" for i in range(8))
POOL8 = PoolPolicy(model="m", replicas=[f"http://{n}:1" for n in EIGHT])


@pytest.mark.parametrize(
    ("holders_recent", "others_recent", "chosen_among"),
    [
        # One other replica is quiet by chance; the typical one is as busy as the holders.
        (10.0, (2.0, 10.0, 10.0, 10.0, 10.0, 10.0), {"r0", "r1"}),
        # The holders are busier than the typical other by more than the balance factor: the
        # quietest replica becomes a third home.
        (20.0, (2.0, 10.0, 10.0, 10.0, 10.0, 10.0), {"r2"}),
    ],
)
def test_a_hot_prefix_gains_a_home_only_when_its_holders_stand_above_the_typical_replica(
    holders_recent: float, others_recent: tuple[float, ...], chosen_among: set[str]
) -> None:
    """12 of the pool's first 64 requests: k = ceil(0.19 x 8 x 1.25) = 2, already held on 2."""
    policy = PrefixAware(POOL8)
    first = policy.select(FEATURES, PoolSnapshot(tuple(candidate(n) for n in EIGHT)))
    assert first is not None
    for i in range(12):
        policy.record(FEATURES, type(first)(EIGHT[i % 2], Route.PREFIX_HIT), now=0.0)
    recents = (holders_recent, holders_recent, *others_recent)
    snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in zip(EIGHT, recents, strict=True)))
    assert choose(policy, snap).replica in chosen_among


def test_a_prefix_with_a_small_share_keeps_one_home() -> None:
    requests = [features(system_prompt(f"tenant {i % 16} ".encode() * 200)) for i in range(160)]
    policy = PrefixAware(POOL)
    replay(policy, requests)
    holders = [sum(policy.matched_blocks(n, r) > 0 for n in NAMES) for r in requests[:16]]
    assert max(holders) == 1


# --- every policy -----------------------------------------------------------------------------


def test_no_candidate_gives_no_decision() -> None:
    for name in PolicyName:
        policy = make_policy(POOL.model_copy(update={"policy": name}))
        assert policy.select(FEATURES, PoolSnapshot(())) is None


def test_only_snapshot_candidates_are_ever_chosen() -> None:
    # The snapshot carries healthy replicas only; what the index says of others is moot.
    only_b = PoolSnapshot((candidate("b", running=7),))
    for name in PolicyName:
        policy = make_policy(POOL.model_copy(update={"policy": name}))
        policy.record(
            FEATURES, type(choose(PrefixAware(POOL), snapshot()))("a", Route.PREFIX_HIT), 0.0
        )
        decision = policy.select(FEATURES, only_b)
        assert decision is not None and decision.replica == "b"


def test_the_decision_explains_every_candidate() -> None:
    decision = choose(holding(HOME), snapshot(candidate(SECOND, running=3)))
    assert {c.name for c in decision.costs} == set(NAMES)
    for cost in decision.costs:
        parts = cost.estimate.wait_s + cost.estimate.prefill_s + cost.estimate.step_s
        assert cost.estimate.total_s == pytest.approx(parts)
    assert decision.estimate is not None
    assert decision.estimate.total_s == min(c.estimate.total_s for c in decision.costs)


def test_least_loaded_baseline_ignores_matches() -> None:
    policy = make_policy(POOL.model_copy(update={"policy": PolicyName.LEAST_LOADED}))
    cands = [candidate(n, running=0 if n == "b" else 1) for n in NAMES]
    decision = policy.select(FEATURES, PoolSnapshot(tuple(cands)))
    assert decision is not None and (decision.replica, decision.route) == ("b", Route.LEAST_LOADED)


def test_least_loaded_ties_follow_the_prefix_not_the_list_order() -> None:
    policy = make_policy(POOL.model_copy(update={"policy": PolicyName.LEAST_LOADED}))
    decision = policy.select(FEATURES, snapshot())
    assert decision is not None and decision.replica == HOME


def test_round_robin_cycles_through_candidates() -> None:
    rr = make_policy(POOL.model_copy(update={"policy": PolicyName.ROUND_ROBIN}))
    picks = []
    for i in range(8):
        decision = rr.select(FEATURES, PoolSnapshot(tuple(Candidate(n) for n in NAMES), i))
        assert decision is not None and decision.route is Route.ROUND_ROBIN
        picks.append(decision.replica)
    assert picks == list(NAMES) * 2


def test_round_robin_needs_no_fingerprint_and_no_load() -> None:
    rr = make_policy(POOL.model_copy(update={"policy": PolicyName.ROUND_ROBIN}))
    assert not rr.needs


# --- a TTFT objective under overload ---------------------------------------------------------

OBJECTIVE_POOL = POOL.model_copy(
    update={"cost": POOL.cost.model_copy(update={"ttft_objective_s": 2.0})}
)


def full(name: str, requests: float) -> Candidate:
    """A decode-bound replica with 4 slots, each held 3 s: a queue of ``requests``."""
    return candidate(name, requests=requests, running=4, slots=4, service_s=3.0)


def test_a_request_late_everywhere_joins_the_queue_furthest_behind() -> None:
    snap = snapshot(full("a", 7), full("b", 9), full("c", 7), full("d", 8))
    decision = choose(PrefixAware(OBJECTIVE_POOL), snap)
    assert (decision.replica, decision.route) == ("b", Route.LATE)
    # Without an objective it goes where it is least late.
    assert choose(PrefixAware(POOL), snap).replica in {"a", "c"}


def test_long_prompts_late_by_their_own_prefill_spread_over_an_idle_pool() -> None:
    # Each prefill alone (~8,000 tokens) is past a 0.5 s objective: late by its length.
    policy = PrefixAware(
        POOL.model_copy(update={"cost": POOL.cost.model_copy(update={"ttft_objective_s": 0.5})})
    )
    queued: dict[str, float] = dict.fromkeys(NAMES, 0.0)
    for i in range(12):
        prompt = features(CanonicalPrompt(b"%d " % i + b"x" * 32_000))
        snap = snapshot(
            *(
                candidate(n, pending_prefill_tokens=t, pending_requests=t / 8000)
                for n, t in queued.items()
            )
        )
        decision = choose(policy, snap, prompt)
        policy.record(prompt, decision, now=0.0)
        queued[decision.replica] += 8000.0
    assert max(queued.values()) <= 3 * 8000.0, queued


def test_a_request_that_can_be_in_time_goes_where_it_is() -> None:
    snap = snapshot(full("a", 4), full("b", 9), full("c", 7), full("d", 8))
    decision = choose(PrefixAware(OBJECTIVE_POOL), snap)
    assert decision.replica == "a" and decision.route != Route.LATE
