"""Each routing constant's effect, pinned: every default of the prefix-aware policy that shapes
a decision has a case here that the default decides one way and a plausible other value the
other way, so a change to it cannot go unnoticed."""

from __future__ import annotations

import pytest

from router_policies.decision import Decision, PoolSnapshot, Route
from router_policies.fingerprint import CanonicalPrompt
from router_policies.policies.prefix_aware import PrefixAware
from tests.routing import (
    FEATURES,
    NAMES,
    POOL,
    candidate,
    choose,
    features,
    holding,
    rendezvous,
    snapshot,
    system_prompt,
)

# A conversation of ~10k tokens with no shared lead; its earlier turn (~9k) was sent to "a".
EARLIER = features(CanonicalPrompt(b"t" * 36 * 1024))
CONVERSATION = features(CanonicalPrompt(b"t" * 36 * 1024 + b"n" * 4 * 1024))


def test_copy_weight_a_warm_replica_keeps_a_conversation_while_its_queue_costs_under_ten_copies() -> (
    None
):
    """copy_weight 10: "a" holds 9k of the conversation's 10k tokens and has 60k tokens queued
    (~6 s), an idle cold replica would answer in ~1 s but add ~0.9 s of prefill and a second
    copy of the history: 1 s + 10 x 0.9 s is more than the wait. At copy_weight 4 the cold
    replica would win."""
    policy = holding("a", request=EARLIER)
    queued = candidate("a", pending_prefill_tokens=60_000, pending_requests=4, running=4)
    decision = choose(policy, snapshot(queued), CONVERSATION)
    assert (decision.replica, decision.route) == ("a", Route.PREFIX_HIT)


def test_copy_weight_a_queue_longer_than_ten_copies_sends_the_conversation_cold() -> None:
    """~15 s queued on "a": beyond the near band over the cold replica's 1 s + 10 x 0.9 s, so
    the request goes cold to an idle replica. At copy_weight 30 it would still wait on "a"."""
    policy = holding("a", request=EARLIER)
    queued = candidate("a", pending_prefill_tokens=150_000, pending_requests=8, running=8)
    decision = choose(policy, snapshot(queued), CONVERSATION)
    assert decision.replica != "a"
    assert decision.route is Route.LEAST_LOADED


def test_near_ratio_replicas_within_a_quarter_of_the_fastest_share_by_recent_load() -> None:
    """Both hold the prompt; "b" is predicted 10 ms (10%) faster, but "a" had fewer recent
    requests: within near_ratio (25%) of the fastest they count as equally fast, and balance
    chooses "a". With no band the 10 ms would send it to the busier "b"."""
    policy = holding("a", "b")
    a = candidate("a", pending_prefill_tokens=1000, pending_requests=1, recent=0)
    b = candidate("b", pending_prefill_tokens=900, pending_requests=1, recent=10)
    assert choose(policy, snapshot(a, b)).replica == "a"


def test_near_s_a_few_milliseconds_are_equally_fast_whatever_the_ratio() -> None:
    """Both hold the prompt and are predicted ~10 ms; "a" 4 ms more (40%): within near_s
    (5 ms) of the fastest, so balance chooses the less loaded "a"."""
    policy = holding("a", "b")
    a = candidate("a", pending_prefill_tokens=40, pending_requests=1, recent=0)
    b = candidate("b", recent=10)
    assert choose(policy, snapshot(a, b)).replica == "a"


def test_spread_factor_a_prefix_with_45_percent_of_the_traffic_counts_as_warm_on_three() -> None:
    """k = ceil(0.45 x 4 replicas x spread_factor 1.25) = 3: held on "a" and "b", the hot
    prefix also counts as warm on the least recently loaded other replica, which takes the
    request. With spread_factor 1, k = 2 and it would stay on its two holders."""
    policy = PrefixAware(POOL)
    holders, others = ("a", "b"), ("c", "d")
    first = choose(policy, snapshot())
    for i in range(29):  # 29 of the pool's 64 recent requests
        policy.record(FEATURES, type(first)(holders[i % 2], Route.PREFIX_HIT), now=0.0)
    for i in range(35):
        other = features(system_prompt(f"tenant {i} ".encode() * 40))
        policy.record(other, type(first)(others[i % 2], Route.PREFIX_HOME), now=0.0)
    # The holders no busier than the typical other replica: no valley to fill.
    recent = {"a": 5.0, "b": 5.0, "c": 4.0, "d": 5.0}
    snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in recent.items()))
    decision = choose(policy, snap)
    assert decision.replica == "c"


def test_min_match_ratio_a_shared_lead_under_half_the_prompt_goes_by_load() -> None:
    """A system prompt that is 40% of the prompt: under min_match_ratio (0.5) it is not worth a
    home (Preble's rule), so the prompt goes to the least recently loaded replica as a
    least-loaded route. At 0.3 it would be placed as a prefix-home."""
    lead = b"s" * 16 * 128
    prompt = features(CanonicalPrompt(lead + b"u" * 24 * 128, lead_bytes=len(lead)))
    quiet = rendezvous(prompt.home_key)[-1]
    recent = {n: 0.0 if n == quiet else 3.0 for n in NAMES}
    snap = PoolSnapshot(tuple(candidate(n, recent=r) for n, r in recent.items()))
    decision = choose(PrefixAware(POOL), snap, prompt)
    assert (decision.replica, decision.route) == (quiet, Route.LEAST_LOADED)


@pytest.mark.parametrize(("index_memory", "back_to_a"), [(1.0, False), (1.5, True)])
def test_index_memory_one_cache_forgets_a_history_the_engine_has_evicted(
    index_memory: float, back_to_a: bool
) -> None:
    """ "a" holds one cache of 400 blocks and took a cache's worth of other text since the
    conversation's earlier turn (288 blocks), so its engine has evicted that history. At
    index_memory 1 the index forgets it with the engine: the next turn goes by turnover, to a
    replica that took less. At 1.5 the index still holds the history's first 200 blocks (its
    tail went first), most of the turn, and the turn goes back to "a"."""
    prefix = POOL.prefix.model_copy(update={"index_memory": index_memory})
    policy = PrefixAware(POOL.model_copy(update={"prefix": prefix}))
    for name in NAMES:
        policy.size_index(name, 400)
    policy.record(EARLIER, Decision("a", Route.LEAST_LOADED), now=0.0)
    for i in range(4):  # 100 blocks each
        other = features(CanonicalPrompt(f"other {i} ".encode() * (100 * 128 // 8)))
        policy.record(other, Decision("a", Route.LEAST_LOADED), now=0.0)
    decision = choose(policy, snapshot(), CONVERSATION)
    if back_to_a:
        assert (decision.replica, decision.route) == ("a", Route.PREFIX_HIT)
    else:
        assert decision.replica != "a"
