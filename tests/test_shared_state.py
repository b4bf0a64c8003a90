"""The shared-state layer without Redis: what one instance publishes of a dispatch, how another
replays it, how the other instances' counts join the local view, and the settings that pick
the backend. (Against a real redis-server: tests/test_shared_state_redis.py.)"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson
import pytest
from prometheus_client import Histogram
from pydantic import SecretStr

from gateway.cli import main
from gateway.fleet.pools import Fleet
from gateway.routing.affinity import AdapterHomes
from gateway.settings import Settings
from gateway.shared_state import LocalState, Outbox, codec
from gateway.shared_state.figures import GAP_S, RemoteFigures, own_figures
from gateway.shared_state.replay import apply_batch, encode_batch
from router_policies.decision import Route
from router_policies.fingerprint import CanonicalPrompt, RequestFeatures
from tests.conftest import MODEL
from tests.shared_state import NAMES, SYSTEM, dispatch_to, features, fleet, pool_of

SYNC_S = 0.075
"""GATEWAY_STATE_SYNC_INTERVAL_S's default."""

# -- what travels --------------------------------------------------------------------------------


def test_features_survive_the_round_trip_through_json_values() -> None:
    request = features(pool_of(fleet()), SYSTEM)
    assert codec.decode(list(codec.FIELDS), codec.encode(request)) == request


def test_a_field_the_receiver_does_not_know_is_ignored_and_a_missing_one_defaults() -> None:
    request = features(pool_of(fleet()), SYSTEM)
    names = [*codec.FIELDS, "from_a_newer_gateway"]
    decoded = codec.decode(names, [*codec.encode(request), 42])
    assert decoded == request
    required = [
        f.name for f in dataclasses.fields(RequestFeatures) if f.default is dataclasses.MISSING
    ]
    partial = codec.decode(
        required, [codec.encode(request)[codec.FIELDS.index(n)] for n in required]
    )
    assert partial is not None and partial.block_hashes == request.block_hashes


def test_values_that_cannot_make_features_are_dropped_not_raised() -> None:
    assert codec.decode(["no_such_field"], [1]) is None


# -- publishing ----------------------------------------------------------------------------------


def test_without_a_shared_backend_a_dispatch_publishes_nothing() -> None:
    f = fleet()
    pool = pool_of(f)
    assert pool.outbox is None
    dispatch_to(pool, NAMES[0], features(pool, SYSTEM))  # no outbox: nothing to append to
    assert pool.outbox is None and f.outbox is None  # nor did the dispatch make one


def test_a_dispatch_lands_in_the_outbox_once_the_fleet_shares() -> None:
    f = fleet()
    outbox = Outbox()
    f.attach(outbox)
    pool = pool_of(f)
    request = features(pool, SYSTEM)
    dispatch_to(pool, NAMES[2], request)
    [(_, pool_name, replica, sent)] = outbox.peek(10)
    assert (pool_name, replica, sent) == ("small", NAMES[2], request)


def test_a_reloaded_fleet_keeps_sharing_through_the_same_outbox() -> None:
    f = fleet()
    outbox = Outbox()
    f.attach(outbox)
    reloaded = Fleet(f.policy, f)
    assert reloaded.outbox is outbox and pool_of(reloaded).outbox is outbox


def test_the_outbox_is_bounded_and_forgets_its_oldest_first() -> None:
    outbox = Outbox(limit=3)
    request = RequestFeatures(MODEL, (1,), 1)
    for i in range(5):
        outbox.dispatched("small", f"r{i}", request)
    assert [replica for _, _, replica, _ in outbox.peek(10)] == ["r2", "r3", "r4"]
    outbox.drop(2)
    assert [replica for _, _, replica, _ in outbox.peek(10)] == ["r4"]


# -- replaying another instance's dispatch ------------------------------------------------------


def test_a_prefix_another_instance_sent_somewhere_is_a_prefix_hit_there_here() -> None:
    here = pool_of(fleet())
    request = features(here, SYSTEM)
    cold = here.decide(request)
    assert cold is not None and cold.route is Route.PREFIX_HOME
    elsewhere = next(n for n in NAMES if n != cold.replica)
    here.apply_remote_dispatch(elsewhere, request, at=0.0)
    warm = here.decide(request)
    assert warm is not None
    assert (warm.replica, warm.route) == (elsewhere, Route.PREFIX_HIT)


def test_a_replayed_dispatch_is_not_in_flight_here_but_counts_as_recent_load() -> None:
    here = pool_of(fleet())
    now = time.monotonic()
    here.apply_remote_dispatch(NAMES[1], features(here, SYSTEM), at=now)
    replica = here.replicas[NAMES[1]]
    assert replica.inflight == 0
    assert replica.recent.value(now) == pytest.approx(1.0, rel=0.01)


def test_a_late_dispatch_counts_as_recent_load_only_as_much_as_its_age_leaves() -> None:
    here = pool_of(fleet())
    half_life = here.policy.load.recent_half_life_s
    now = time.monotonic()
    here.apply_remote_dispatch(NAMES[1], features(here, SYSTEM), at=now - 2 * half_life)
    assert here.replicas[NAMES[1]].recent.value(now) == pytest.approx(0.25, rel=0.01)


def test_a_replayed_adapter_request_marks_its_replica_warm_for_that_adapter_here() -> None:
    there, here = fleet(), fleet()
    pool = pool_of(there)
    text = b"SELECT name FROM ships"
    lora = pool.router.features("sql-lora", lambda: CanonicalPrompt(text, lead_bytes=0))
    base = features(pool, SYSTEM)
    sent = [(time.time(), "small", NAMES[2], lora), (time.time(), "small", NAMES[3], base)]
    adapters = AdapterHomes()
    apply_batch(here, encode_batch(sent), Histogram("lag", "", registry=None), adapters)
    now = time.monotonic()
    assert adapters.warm("small", "sql-lora", now, 60.0) == {NAMES[2]}
    assert adapters.warm("small", MODEL, now, 60.0) == frozenset()  # the base model is no adapter


def test_records_another_version_or_a_broken_writer_sent_are_skipped_and_the_rest_replayed() -> (
    None
):
    there, here = fleet(), fleet()
    good = (time.time(), "small", NAMES[1], features(pool_of(there), SYSTEM))
    batch = orjson.loads(encode_batch([good]))
    record = batch["d"][0]
    batch["d"] = [
        ["yesterday", *record[1:]],  # a time that is no number
        [record[0], ["small"], *record[2:]],  # a pool name that is no name
        [*record[:3], {"not": "a list"}],  # values in another shape
        record,
    ]
    apply_batch(here, orjson.dumps(batch), Histogram("lag", "", registry=None))
    recent = pool_of(here).replicas[NAMES[1]].recent.value(time.monotonic())
    assert recent == pytest.approx(1.0, rel=0.01)  # the good one, after three that are not


def test_a_dispatch_to_a_replica_this_instance_does_not_know_is_ignored() -> None:
    here = pool_of(fleet())
    here.apply_remote_dispatch("127.0.0.1:1", features(here, SYSTEM), at=time.monotonic())
    assert all(r.recent.value(time.monotonic()) == 0.0 for r in here.replicas.values())


# -- the other instances' counts -----------------------------------------------------------------


def test_counts_published_by_other_instances_add_to_the_local_view() -> None:
    theirs, mine = fleet(), fleet()
    pool_of(theirs).replicas[NAMES[0]].inflight = 3
    pool_of(theirs).counts.arrivals = 10
    pool_of(mine).replicas[NAMES[0]].inflight = 1
    remote = RemoteFigures(SYNC_S)
    remote.apply(mine, {"a": _as_hash(theirs), "b": _as_hash(theirs)}, now=0.0)
    pool = pool_of(mine)
    assert pool.replicas[NAMES[0]].remote_inflight == 6
    seen = {c.name: c.inflight for c in pool.snapshot().candidates}
    assert seen[NAMES[0]] == 7
    pool_of(theirs).counts.arrivals = 15
    remote.apply(mine, {"a": _as_hash(theirs), "b": _as_hash(theirs)}, now=0.1)
    assert pool.counts.remote.arrivals == 10  # each one's increase since the first read


def test_prefill_queued_by_other_instances_counts_in_the_cost_models_view() -> None:
    theirs, mine = fleet(), fleet()
    busy = pool_of(theirs).replicas[NAMES[2]]
    busy.pending_requests, busy.pending_prefill_tokens = 2, 3000.0
    RemoteFigures(SYNC_S).apply(mine, {"a": _as_hash(theirs)})
    load = pool_of(mine).replicas[NAMES[2]].load()
    assert (load.pending_requests, load.pending_prefill_tokens) == (2, 3000.0)


def test_arrivals_only_grow_when_an_instance_restarts_or_disappears() -> None:
    theirs, mine = fleet(), fleet()
    remote = RemoteFigures(SYNC_S)
    pool_of(theirs).counts.arrivals = 10
    remote.apply(mine, {"a": _as_hash(theirs)}, now=0.0)
    pool_of(theirs).counts.arrivals = 12
    remote.apply(mine, {"a": _as_hash(theirs)}, now=0.1)
    assert pool_of(mine).counts.remote.arrivals == 2
    pool_of(theirs).counts.arrivals = 4  # it restarted, counting from 0
    remote.apply(mine, {"a": _as_hash(theirs)}, now=0.2)
    assert pool_of(mine).counts.remote.arrivals == 6
    remote.apply(mine, {}, now=0.3)  # it left (its counts expired)
    assert pool_of(mine).counts.remote.arrivals == 6


@pytest.mark.parametrize(
    ("gap", "missing", "counted"),
    [
        (0.5, False, 600),  # a flapping backend's failed rounds: what came in between counts
        (GAP_S + 0.5, False, 0),  # the backend away: what came meanwhile is no burst now
        (0.2, True, 0),  # it was silent past the state TTL, so reads left it out
    ],
    ids=["short-gap", "outage", "missing-instance"],
)
def test_counts_unseen_for_a_while_are_no_burst_of_arrivals(
    gap: float, missing: bool, counted: int
) -> None:
    # The autoscaling rate reads the sum's growth: an instance's total before it was first
    # seen, or through a gap, arrived over that time, not in one read.
    theirs, mine = fleet(), fleet()
    remote = RemoteFigures(SYNC_S)
    pool_of(theirs).counts.arrivals = 100_000  # running long before this one started
    remote.apply(mine, {"a": _as_hash(theirs)}, now=0.0)
    assert pool_of(mine).counts.remote.arrivals == 0
    if missing:
        remote.apply(mine, {}, now=gap / 2)
    pool_of(theirs).counts.arrivals += 600
    remote.apply(mine, {"a": _as_hash(theirs)}, now=gap)
    assert pool_of(mine).counts.remote.arrivals == counted
    pool_of(theirs).counts.arrivals += 10
    remote.apply(mine, {"a": _as_hash(theirs)}, now=gap + 0.1)
    assert pool_of(mine).counts.remote.arrivals == counted + 10


def test_reads_a_sync_interval_apart_count_what_arrived_between_them() -> None:
    # GATEWAY_STATE_SYNC_INTERVAL_S may be up to 5 s: reads that far apart are no gap.
    theirs, mine = fleet(), fleet()
    remote = RemoteFigures(2.0)
    for i, now in enumerate((0.0, 2.0, 4.0)):
        pool_of(theirs).counts.arrivals = 100 * i
        remote.apply(mine, {"a": _as_hash(theirs)}, now=now)
    assert pool_of(mine).counts.remote.arrivals == 200


def test_a_count_that_is_no_number_is_left_out_not_raised() -> None:
    # Another version's field, or a broken write: the others' counts are read all the same.
    theirs, mine = fleet(), fleet()
    pool_of(theirs).replicas[NAMES[0]].inflight = 3
    fields: dict[str, Any] = {**_as_hash(theirs), "w\x1fsmall": None, "a\x1fsmall": "many"}
    RemoteFigures(SYNC_S).apply(mine, {"a": fields})
    assert pool_of(mine).replicas[NAMES[0]].remote_inflight == 3


def test_when_the_backend_is_away_only_local_counts_remain() -> None:
    theirs, mine = fleet(), fleet()
    pool_of(theirs).replicas[NAMES[0]].inflight = 3
    RemoteFigures(SYNC_S).apply(mine, {"a": _as_hash(theirs)})
    RemoteFigures.forget(mine)
    assert pool_of(mine).replicas[NAMES[0]].remote_inflight == 0


def _as_hash(f: Fleet) -> dict[str, str]:
    """What an instance's Redis hash holds, as the reader decodes it."""
    return {k: str(v) for k, v in own_figures(f).items()}


# -- choosing the backend ------------------------------------------------------------------------


def test_local_is_the_default_backend() -> None:
    assert Settings().redis_url is None
    assert LocalState().up


def test_an_empty_redis_url_means_no_redis() -> None:
    assert Settings(redis_url=SecretStr("  ")).redis_url is None


def test_serve_refuses_zero_workers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--workers", "0"]) == 2
    assert "error: --workers:" in capsys.readouterr().err
