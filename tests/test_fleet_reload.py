"""A policy reload builds a new Fleet from the old one: what carries over, and what must not."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.fleet.pools import Dispatch, EngineStats, Fleet, PoolSaturated, PoolState
from gateway.http.errors import pool_saturated
from router_policies.fingerprint import RequestFeatures, canonical_chat, fingerprint
from router_policies.schema import InvalidPolicy, parse_policy

MODEL = "sim-model"
A, B, C = (f"http://127.0.0.1:{port}" for port in (9101, 9102, 9103))


def name(url: str) -> str:
    return url.removeprefix("http://")


def fleet(replicas: list[str], previous: Fleet | None = None, **pool: Any) -> Fleet:
    policy = parse_policy({"pools": {"small": {"model": MODEL, "replicas": replicas, **pool}}})
    return Fleet(policy, previous=previous)


def small(f: Fleet) -> PoolState:
    return f.pools["small"]


def features(
    pool: PoolState, system: str = "You are the billing assistant. " * 30
) -> RequestFeatures:
    prompt = canonical_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
    )
    prefix = pool.policy.prefix
    return fingerprint(MODEL, prompt, prefix.layout, prefix.max_blocks)


def send_to(pool: PoolState, url: str, request: RequestFeatures) -> Dispatch:
    """Dispatch one request to ``url`` (the others excluded), leaving it in flight."""
    others = [r for r in pool.replicas if r != name(url)]
    decision = pool.decide(request, exclude=others)
    assert decision is not None and decision.replica == name(url)
    return pool.begin(decision, request)


def test_a_surviving_replica_keeps_its_state_object_health_and_in_flight_count() -> None:
    old = fleet([A, B])
    pool = small(old)
    send_to(pool, A, features(pool))
    pool.replicas[name(B)].mark_down()
    a_state = pool.replicas[name(A)]

    new = fleet([A, B], previous=old, load={"balance_eps": 0.5})

    replicas = small(new).replicas
    assert replicas[name(A)] is a_state
    assert replicas[name(A)].inflight == 1
    assert replicas[name(B)].healthy is False


@pytest.mark.parametrize(
    "changed",
    [
        {"load": {"balance_eps": 0.5}},
        # What a match is worth, or how much the index keeps, is tuned live: the digests held
        # mean the same under the new values.
        {"prefix": {"min_match_ratio": 0.4}},
        {"prefix": {"min_match_blocks": 2}},
        {"prefix": {"chars_per_token": 3.5}},
        {"prefix": {"index_memory": 1.5}},
        {"prefix": {"max_blocks": 2048}},
        {"prefix": {"events": {"stall_s": 10.0}}},
    ],
    ids=lambda changed: ".".join((*changed, *next(iter(changed.values())))),
)
def test_the_prefix_index_survives_a_reload_that_keeps_the_fingerprint_settings(
    changed: dict[str, Any],
) -> None:
    old = fleet([A, B])
    pool = small(old)
    request = features(pool)
    send_to(pool, A, request)

    new = small(fleet([A, B], previous=old, **changed))

    decision = new.decide(request)
    assert decision is not None
    assert decision.replica == name(A)
    assert decision.matched_blocks == len(request.block_hashes)


def test_a_reload_gives_kept_replicas_the_rates_they_take_from_the_policy() -> None:
    # The policy's rates are the ones in use until a replica has learned its own, and always
    # with learning off: those become the new ones. Learned rates are kept while learning is on.
    old = fleet([A, B])
    pool = small(old)
    learned = pool.replicas[name(B)].learner
    for tokens in range(20):
        learned.observe(1000.0 * tokens, 1.0, 0.01 + 1e-5 * tokens)
    learned_rates = learned.rates()
    slower = {"prefill_tokens_per_s": 2000.0}

    tuned = fleet([A, B], previous=old, cost=slower, load={"recent_half_life_s": 1.0})

    kept = small(tuned).replicas[name(A)]
    assert kept is pool.replicas[name(A)]
    assert kept.learner.rates().prefill_s_per_token == pytest.approx(1 / 2000.0)
    assert small(tuned).replicas[name(B)].learner.rates() == learned_rates
    later = time.monotonic() + 10.0
    kept.recent.add(later, 8.0)
    assert kept.recent.value(later + 1.0) == pytest.approx(4.0)  # halved in the new 1 s
    off = small(fleet([A, B], previous=tuned, cost={**slower, "learn": False}))
    assert off.replicas[name(B)].learner.rates().prefill_s_per_token == pytest.approx(1 / 2000.0)


def test_changed_fingerprint_settings_clear_the_index() -> None:
    old = fleet([A, B])
    pool = small(old)
    request = features(pool)
    send_to(pool, A, request)

    new = small(fleet([A, B], previous=old, prefix={"block_bytes": 256}))

    # Digests of 128-byte blocks would match nothing under 256-byte ones; an index kept
    # anyway would still claim the old request's blocks.
    for probe in (request, features(new)):
        decision = new.decide(probe)
        assert decision is not None
        assert decision.matched_blocks == 0


def test_removed_replicas_are_dropped_and_new_ones_start_fresh_and_unused_until_probed() -> None:
    # A replica still loading (its port open, no answer yet) would hold each request sent to it
    # up to the first-byte timeout: at start-up no replica is used before a probe, nor after.
    old = fleet([A, B])
    pool = small(old)
    send_to(pool, B, features(pool))
    a_state = pool.replicas[name(A)]

    new = small(fleet([A, C], previous=old))

    assert list(new.replicas) == [name(A), name(C)]
    assert new.replicas[name(A)] is a_state
    added = new.replicas[name(C)]
    assert (added.healthy, added.inflight, added.probed) == (False, 0, False)
    assert new.decide(features(new), exclude=[name(A)]) is None

    added.record_probe(True, unhealthy_after=1, healthy_after=1)

    decision = new.decide(features(new), exclude=[name(A)])
    assert decision is not None and decision.replica == name(C)


def test_a_replica_moved_to_another_pool_keeps_what_the_probes_found_until_probed_there() -> None:
    policy = {"model": MODEL, "replicas": [A, B]}
    old = Fleet(parse_policy({"pools": {"small": policy}}))
    for replica in small(old).replicas.values():
        replica.record_probe(replica.url == A, unhealthy_after=1, healthy_after=1)

    renamed = Fleet(parse_policy({"pools": {"renamed": policy}}), previous=old)

    health = {r.name: r.healthy for r in renamed.pools["renamed"].replicas.values()}
    assert health == {name(A): True, name(B): False}


async def test_requests_waiting_for_a_slot_stay_first_in_line_across_a_reload() -> None:
    old = fleet([A], max_inflight_per_replica=1)
    pool = small(old)
    request = features(pool)
    decision = pool.decide(request)
    assert decision is not None
    running = pool.begin(decision, request)
    first = asyncio.create_task(pool.acquire(features(pool, "tenant one " * 30)))
    await asyncio.sleep(0.01)

    new = small(fleet([A], previous=old, max_inflight_per_replica=1, load={"balance_eps": 0.5}))

    assert new.gateway_waiting == 1
    second = asyncio.create_task(new.acquire(features(new, "tenant two " * 30)))
    await asyncio.sleep(0.01)
    assert new.gateway_waiting == 2  # the newcomer queues behind the one carried over
    # Requests keep the generation they started under: the old one's end frees the slot.
    pool.end(running)
    got_first = await asyncio.wait_for(first, 1.0)
    assert got_first is not None and not second.done()
    pool.end(got_first)
    got_second = await asyncio.wait_for(second, 1.0)
    assert got_second is not None and got_second.replica is new.replicas[name(A)]
    assert new.replicas[name(A)].inflight == 1


def test_a_replica_removed_then_added_back_starts_with_an_empty_index() -> None:
    # The same address back (a StatefulSet scaled down and up again) is a new engine with
    # an empty cache: the index of the one removed must not claim its blocks.
    old = fleet([A, B])
    request = features(small(old))
    send_to(small(old), B, request)

    back = small(fleet([A, B], previous=fleet([A], previous=old)))

    assert back.router.estimated_cached_bytes(name(B), request) == 0


def test_a_replica_restarted_on_its_address_starts_with_an_empty_index() -> None:
    # A crashed container back on the same address: its engine's counters start over, and
    # its cache is empty, which the index must not go on claiming.
    pool = small(fleet([A, B]))
    request = features(pool)
    send_to(pool, B, request)
    restarted = pool.replicas[name(B)]
    pool.apply_engine_stats(restarted, EngineStats(prefix_lookups=5000.0))
    pool.apply_engine_stats(restarted, EngineStats(prefix_lookups=6000.0))
    assert pool.router.estimated_cached_bytes(name(B), request) > 0  # the same process

    pool.apply_engine_stats(restarted, EngineStats(prefix_lookups=40.0))

    assert pool.router.estimated_cached_bytes(name(B), request) == 0


def test_a_replica_restarted_on_its_address_is_learned_again_from_what_it_shows() -> None:
    """The new process may be another vLLM (an upgrade, other flags): its batch size and
    whether its usage reports cached tokens are known again only from what it shows, not
    carried over from the process before (every answer would count as a cache miss)."""
    pool = small(fleet([A, B]))
    replica = pool.replicas[name(B)]
    for _ in range(2):
        pool.apply_engine_stats(replica, EngineStats(running=4, waiting=2, prefix_lookups=5e3))
    replica.reports_cached = True
    assert replica.slots.value == 4

    pool.apply_engine_stats(replica, EngineStats(prefix_lookups=40.0))

    assert replica.slots.value == math.inf
    assert not replica.reports_cached


async def test_a_request_waiting_for_a_slot_goes_to_a_replica_a_reload_adds() -> None:
    old = fleet([A], max_inflight_per_replica=1, queue_timeout_s=5)
    pool = small(old)
    send_to(pool, A, features(pool))
    waiting = asyncio.create_task(pool.acquire(features(pool, "tenant one " * 30)))
    await asyncio.sleep(0.05)

    new = small(fleet([A, B], previous=old, max_inflight_per_replica=1, queue_timeout_s=5))
    await asyncio.sleep(0.3)  # a recheck, before B's first probe: nothing for it yet
    assert not waiting.done()
    new.replicas[name(B)].record_probe(True, unhealthy_after=1, healthy_after=1)

    got = await asyncio.wait_for(waiting, 1.0)  # within a recheck, not at the queue timeout
    assert got is not None and got.replica is new.replicas[name(B)]


async def test_a_request_waiting_for_a_slot_never_goes_to_a_replica_a_reload_removed() -> None:
    old = fleet([A, B], max_inflight_per_replica=1, queue_timeout_s=5)
    pool = small(old)
    on_a = send_to(pool, A, features(pool))
    on_b = send_to(pool, B, features(pool, "tenant two " * 30))
    waiting = asyncio.create_task(pool.acquire(features(pool, "tenant one " * 30)))
    await asyncio.sleep(0.05)

    new = small(fleet([A], previous=old, max_inflight_per_replica=1, queue_timeout_s=5))
    pool.end(on_b)  # the removed replica's slot frees up
    await asyncio.sleep(0.4)  # longer than a recheck

    assert not waiting.done()
    pool.end(on_a)
    got = await asyncio.wait_for(waiting, 1.0)
    assert got is not None and got.replica is new.replicas[name(A)]


async def test_a_request_waiting_for_a_pool_a_reload_removed_is_refused_at_once() -> None:
    old = fleet([A], max_inflight_per_replica=1, queue_timeout_s=30)
    pool = small(old)
    in_flight = send_to(pool, A, features(pool))
    waiting = asyncio.create_task(pool.acquire(features(pool, "tenant one " * 30)))
    await asyncio.sleep(0.05)

    other = {"large": {"model": "other-model", "replicas": [B]}}
    Fleet(parse_policy({"pools": other}), previous=old)

    with pytest.raises(PoolSaturated) as refused:
        await asyncio.wait_for(waiting, 1.0)  # not at the queue timeout, nor ever dispatched
    assert (refused.value.pool, refused.value.removed) == ("small", MODEL)
    error = pool_saturated(refused.value, pool.policy.queue_timeout_s)
    assert (error.status, error.code) == (503, "pool_removed")
    assert MODEL in error.message and "retry-after" in {h.lower() for h in error.answer_headers()}
    assert pool.gateway_waiting == 0
    # The request already in flight on the removed pool finishes as usual.
    pool.end(in_flight)
    assert pool.replicas[name(A)].inflight == 0


async def test_an_attempt_after_a_reload_never_goes_to_a_replica_it_removed() -> None:
    old = fleet([A, B])
    small(fleet([A], previous=old))
    # A retry of a request routed before the reload, its first attempt on A.
    assert await small(old).acquire(features(small(old)), exclude=[name(A)]) is None


def test_a_reload_refused_midway_leaves_waiting_requests_with_the_running_pool(
    tmp_path: Path,
) -> None:
    not_a_model = tmp_path / "tiers.json.gz"
    not_a_model.write_bytes(b"not gzip")
    old = tiered()
    rates = small(old).replicas[name(A)].learner.rates()
    with pytest.raises(InvalidPolicy):
        cost = {"prefill_tokens_per_s": 2000.0}
        tiered(previous=old, cost=cost, classifier="learned", model=str(not_a_model))
    assert small(old).latest() is small(old)
    assert small(old).replicas[name(A)].learner.rates() == rates  # nor its replicas' settings


def _scale_up_then_calm(pool: PoolState) -> None:
    """A deep engine queue asks for more replicas; then the queue empties."""
    replica = pool.replicas[name(A)]
    pool.apply_engine_stats(replica, EngineStats(waiting=40))
    pool.update_desired(1000.0)
    assert (pool.autoscale.desired or 0) > 1
    pool.apply_engine_stats(replica, EngineStats(waiting=0))


def test_the_autoscale_history_carries_over_so_a_reload_does_not_scale_down() -> None:
    old = fleet([A])
    pool = small(old)
    pool.counts.arrivals = 7
    _scale_up_then_calm(pool)
    peak = pool.autoscale.desired

    new = small(fleet([A], previous=old, load={"balance_eps": 0.5}))

    new.update_desired(1001.0)
    assert new.autoscale.raw_desired == 1
    assert (
        new.autoscale.desired == peak
    )  # the scale-down stabilisation window still remembers the peak
    assert new.counts.arrivals == 7


def test_a_lowered_max_replicas_bounds_the_remembered_peak_at_once() -> None:
    old = fleet([A])
    _scale_up_then_calm(small(old))
    assert (small(old).autoscale.desired or 0) > 2

    new = small(fleet([A], previous=old, autoscale={"max_replicas": 2}))

    new.update_desired(1001.0)
    assert new.autoscale.desired == 2  # the peak remembered, within the bound now in force


@pytest.mark.parametrize("window", [60.0, 600.0])
def test_a_changed_stabilisation_window_keeps_the_history_within_it(window: float) -> None:
    """A fresh history would let the signal fall at the next round, against an operator who
    lengthened the window; a shorter one holds the peak no longer than itself."""
    old = fleet([A])
    _scale_up_then_calm(small(old))
    peak = small(old).autoscale.desired

    new = small(fleet([A], previous=old, autoscale={"scale_down_stabilization_s": window}))

    new.update_desired(1001.0)
    assert new.autoscale.desired == peak
    new.update_desired(1000.0 + window + 1)
    assert new.autoscale.desired == new.autoscale.raw_desired == 1


def test_the_capacity_measured_is_per_replica_serving_not_per_ejected_one() -> None:
    """An ejected replica completes next to nothing: counted, it reads the others' capacity
    low, and the signal asks for too many."""
    pool = small(fleet([A, B], autoscale={"capacity_window_s": 10}))
    serving, ejected = pool.replicas.values()
    ejected.outlier.ejected_until = math.inf
    pool.apply_engine_stats(serving, EngineStats(waiting=10))  # saturated
    for t in range(40):
        pool.counts.completions = 9 * t  # what the one serving completes
        pool.update_desired(1000.0 + t)
    assert pool.autoscale.capacity.value == pytest.approx(9.0)


def test_a_gateway_just_started_holds_the_pool_at_the_size_it_found() -> None:
    """No history yet, and no arrival rate over a whole window: for one stabilisation window
    the signal does not ask for fewer replicas than serve (an HPA would shed them at once)."""
    pool = small(fleet([A, B, C]))
    assert pool.autoscale.desired is None  # before the first round: the series is absent
    window = pool.autoscale.settings.scale_down_stabilization_s
    pool.update_desired(1000.0)
    assert pool.autoscale.raw_desired == 1 and pool.autoscale.desired == 3
    pool.update_desired(1000.0 + window + 1)
    assert pool.autoscale.desired == 1


def tiered(previous: Fleet | None = None, cost: dict[str, Any] | None = None, **tier: Any) -> Fleet:
    settings = {
        "small": "small",
        "large": "large",
        "threshold": 0.5,
        "calibration": {"target_large_share": 0.5, "window": 10, "min_samples": 10},
        **tier,
    }
    policy = parse_policy(
        {
            "pools": {
                "small": {"model": "small-model", "replicas": [A], "cost": cost or {}},
                "large": {"model": "large-model", "replicas": [B]},
            },
            "tiers": {"auto": settings},
        }
    )
    return Fleet(policy, previous=previous)


def observe(f: Fleet, count: int) -> None:
    """Feed the tier router ``count`` requests of rising difficulty."""
    router = f.tiers["auto"]
    for i in range(count):
        text = "Prove that the sum is convergent step by step. " * i + "hi"
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        router.observe(router.classify(body), sent_large=False)  # the calibration only


def calibrated(f: Fleet) -> float:
    """Feed the tier router ten requests of rising difficulty; its calibrated threshold."""
    observe(f, 10)
    threshold = f.tiers["auto"].threshold
    assert threshold != 0.5
    return threshold


def test_tier_calibration_survives_a_reload_with_the_same_weights_and_calibration() -> None:
    old = tiered()
    threshold = calibrated(old)

    new = tiered(previous=old, allow_header_override=True)

    assert new.tiers["auto"].threshold == threshold


def test_changed_weights_or_calibration_restart_the_tier_calibration() -> None:
    old = tiered(classifier="cue")
    calibrated(old)

    reweighted = tiered(previous=old, classifier="cue", weights={"math": 4.0})
    retargeted = tiered(
        previous=old,
        classifier="cue",
        calibration={"target_large_share": 0.2, "window": 10, "min_samples": 10},
    )

    assert reweighted.tiers["auto"].threshold == 0.5
    assert retargeted.tiers["auto"].threshold == 0.5


def test_a_reloaded_threshold_applies_at_once_while_calibration_warms_up() -> None:
    old = tiered()
    observe(old, 6)  # of the 10 scores calibration waits for

    new = tiered(previous=old, threshold=0.2)

    assert new.tiers["auto"].threshold == 0.2  # the fixed threshold in force until min_samples
    assert old.tiers["auto"].threshold == 0.5  # a reload refused later would leave it as it was
    observe(new, 4)  # the window carried over: four more scores complete it
    assert new.tiers["auto"].threshold not in (0.2, 0.5)
