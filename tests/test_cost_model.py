"""The cost model's parts: learned rates, the TTFT estimate, decayed counts, hot prefixes."""

from __future__ import annotations

import math
import random

import pytest

from gateway.fleet.pools import Dispatch, EngineStats, PoolState
from router_policies.cost.objective import late_choice
from router_policies.cost.rates import RateLearner, Rates
from router_policies.cost.ttft import ReplicaLoad, estimate, predicted_s, queued_tokens
from router_policies.decay import DecayedCount
from router_policies.fingerprint import CanonicalPrompt
from router_policies.hot_prefixes import HotPrefixes, spread
from router_policies.schema import PoolPolicy

PRIOR = Rates(prefill_s_per_token=1e-4, step_s=0.01, decode_s_per_seq=2e-4)


def observe_replica(learner: RateLearner, true: Rates, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        tokens = rng.choice([64, 200, 1500, 2200, 4000])
        running = rng.randint(0, 16)
        ttft = true.step_s + true.prefill_s_per_token * tokens + true.decode_s_per_seq * running
        learner.observe(tokens, running, ttft * rng.uniform(0.95, 1.05))


def test_learned_rates_converge_on_a_replica_twice_as_slow() -> None:
    slow = Rates(PRIOR.prefill_s_per_token * 2, PRIOR.step_s, PRIOR.decode_s_per_seq)
    learner = RateLearner(PRIOR)
    observe_replica(learner, slow, 60)
    assert learner.rates().prefill_s_per_token == pytest.approx(slow.prefill_s_per_token, rel=0.1)


def test_learned_rates_track_a_replica_that_slows_down() -> None:
    learner = RateLearner(PRIOR)
    observe_replica(learner, PRIOR, 100)
    slower = Rates(PRIOR.prefill_s_per_token * 3, PRIOR.step_s, PRIOR.decode_s_per_seq)
    observe_replica(learner, slower, 150, seed=1)
    assert learner.rates().prefill_s_per_token == pytest.approx(slower.prefill_s_per_token, rel=0.1)


def test_the_defaults_hold_until_enough_samples() -> None:
    learner = RateLearner(PRIOR, min_samples=8)
    observe_replica(learner, Rates(1e-2, 1.0, 1e-2), 7)
    assert learner.rates() == PRIOR
    observe_replica(learner, Rates(1e-2, 1.0, 1e-2), 1)
    assert learner.rates() != PRIOR


def test_noise_never_yields_a_free_or_negative_cost() -> None:
    learner = RateLearner(PRIOR)
    for _ in range(50):
        learner.observe(1000, 0, 0.0)  # absurd observations: zero TTFT
    rates = learner.rates()
    assert rates.prefill_s_per_token > 0 and rates.step_s > 0 and rates.decode_s_per_seq >= 0


def test_traffic_that_never_varies_does_not_wind_the_learner_up() -> None:
    """The same prompt size over and over excites one direction only; forgetting must not
    inflate the others until they overflow (a soak once made every prediction NaN)."""
    learner = RateLearner(PRIOR)
    for _ in range(200_000):
        learner.observe(100, 0, 0.001)
    rates = learner.rates()
    assert all(
        math.isfinite(v) for v in (rates.prefill_s_per_token, rates.step_s, rates.decode_s_per_seq)
    )
    learner.observe(float("nan"), 0, 0.1)  # ignored, not poison
    assert math.isfinite(learner.rates().step_s)


def test_rates_are_learned_only_from_requests_that_found_room_in_the_batch() -> None:
    """A request queued for a batch slot waits seconds that the slot term predicts and no rate
    explains: learned as prefill, under overload it made every copy cost seconds, so warm
    replicas kept their queues while others idled."""
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    text = b"a question of its own " * 40
    request = pool.router.features("m", lambda: CanonicalPrompt(text))

    def dispatch(ttft_s: float) -> Dispatch:
        decision = pool.decide(request)
        assert decision is not None
        sent = pool.begin(decision, request, now=0.0)
        pool.first_byte(sent, ttft_s)
        return sent

    in_batch = [dispatch(0.05) for _ in range(4)]
    # Sent before any scrape saw the batch full, and judged once two have: 4 slots.
    queued = [dispatch(5.0) for _ in range(20)]
    for _ in range(2):
        pool.apply_engine_stats(replica, EngineStats(running=4, waiting=20))
    prior = replica.learner.rates()
    for sent in queued:
        pool.end(sent, now=8.0)
    assert replica.learner.samples == 0
    assert replica.learner.rates() == prior
    for sent in in_batch:
        pool.end(sent, now=3.05)
    assert replica.learner.samples == 4
    pool.apply_engine_stats(replica, EngineStats(running=0, waiting=0))
    for _ in range(10):  # room in the batch: the same TTFTs teach the rates
        pool.end(dispatch(5.0), now=8.0)
    assert replica.learner.rates().step_s > 10 * prior.step_s


def test_the_estimate_is_wait_plus_prefill_plus_one_step() -> None:
    load = ReplicaLoad(pending_prefill_tokens=1000, pending_requests=1, running=10)
    est = estimate(load, uncached_tokens=500, prompt_tokens=2000, rates=PRIOR)
    assert est.wait_s == pytest.approx(1000 * 1e-4)
    assert est.prefill_s == pytest.approx(500 * 1e-4)
    assert est.step_s == pytest.approx(0.01 + 10 * 2e-4)
    assert est.total_s == pytest.approx(est.wait_s + est.prefill_s + est.step_s)
    assert predicted_s(load, 500, 2000, PRIOR) == pytest.approx(est.total_s)


def test_a_full_batch_makes_a_request_wait_for_a_slot() -> None:
    """Four slots, six requests there, 2 s each: three must finish before this one starts,
    at four every two seconds."""
    load = ReplicaLoad(requests=6, slots=4, service_s=2.0)
    est = estimate(load, uncached_tokens=0, prompt_tokens=100, rates=PRIOR)
    assert est.slot_s == pytest.approx(3 * 2.0 / 4)
    assert estimate(ReplicaLoad(requests=3, slots=4, service_s=2.0), 0, 100, PRIOR).slot_s == 0
    # Unknown slots (never seen a queue): no slot wait at all.
    assert estimate(ReplicaLoad(requests=300, service_s=2.0), 0, 100, PRIOR).slot_s == 0


def test_engine_queue_beyond_our_own_requests_counts_as_prompts_like_this_one() -> None:
    load = ReplicaLoad(pending_prefill_tokens=300, pending_requests=2, engine_waiting=5)
    assert queued_tokens(load, prompt_tokens=1000) == 300 + 3 * 1000
    # A stale scrape showing fewer than our own pending requests adds nothing.
    assert queued_tokens(ReplicaLoad(300, 2, 0, 1), 1000) == 300


def test_a_decayed_count_halves_every_half_life() -> None:
    count = DecayedCount(half_life_s=10)
    count.add(0.0, 8)
    assert count.value(10.0) == pytest.approx(4)
    assert count.value(30.0) == pytest.approx(1)
    count.add(30.0)
    assert count.value(30.0) == pytest.approx(2)


def test_shares_follow_recent_traffic() -> None:
    hot = HotPrefixes(half_life_s=10)
    for i in range(100):
        hot.record(1 if i % 2 else i, now=i * 0.01)
    assert hot.share(1, 1.0) == pytest.approx(0.5, abs=0.02)
    for i in range(100, 300):  # key 1 goes quiet
        hot.record(i, now=1 + i * 0.1)
    assert hot.share(1, 31.0) < 0.1


def test_a_young_pool_does_not_mistake_a_few_requests_for_all_its_traffic() -> None:
    hot = HotPrefixes(half_life_s=10)
    hot.record(7, now=0.0)
    assert hot.share(7, 0.0) == 1.0
    assert hot.share(7, 0.0, min_total=32) == pytest.approx(1 / 32)


@pytest.mark.parametrize(
    ("share", "replicas", "k"),
    [(0.0, 8, 1), (1 / 32, 8, 1), (0.25, 8, 3), (0.125, 8, 2), (1.0, 8, 8), (0.9, 1, 1)],
)
def test_k_follows_the_share(share: float, replicas: int, k: int) -> None:
    assert spread(share, replicas, factor=1.25) == k


@pytest.mark.parametrize(
    ("predicted", "behind", "objective", "chosen"),
    [
        # No objective: the fastest replica serves it, as always.
        ([3.0, 4.0, 5.0], [3.0, 4.0, 5.0], None, None),
        # Some replica can still serve it in time: no triage.
        ([1.5, 4.0, 5.0], [1.5, 4.0, 5.0], 2.0, None),
        # Late everywhere: the replica furthest behind takes it, leaving the others in time.
        ([3.0, 4.0, 5.0], [3.0, 4.0, 5.0], 2.0, 2),
        # Furthest behind by its queue, not by a cold prefill of this very request.
        ([3.0, 4.5, 4.0], [3.0, 2.5, 4.0], 2.0, 2),
        # Never where it would wait past the limit (30 s): the next furthest behind.
        ([3.0, 40.0, 5.0], [3.0, 40.0, 5.0], 2.0, 2),
        # Past the limit everywhere: the fastest serves it (None).
        ([31.0, 40.0], [31.0, 40.0], 2.0, None),
        # Late by its own prefill (2.5 s on an idle replica), not by the queues: as any other.
        ([2.5, 3.0, 4.0], [0.0, 0.5, 1.5], 2.0, None),
    ],
)
def test_a_request_late_everywhere_goes_to_the_replica_furthest_behind(
    predicted: list[float], behind: list[float], objective: float | None, chosen: int | None
) -> None:
    assert late_choice(predicted, behind, objective, limit_s=30.0) == chosen
