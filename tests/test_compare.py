"""``bench compare``'s runner: resetting a real simulated replica empties its cache while its
counters stand still, the rehearsal sends every request to every replica, each seed and each
workload a fleet runs measures the targets starting from another, the overload fleet runs the
gateway told its objective as a target of its own, arrivals schedule the conversations, and
one small end-to-end comparison on a tiny simulated fleet, for the gateway's
targets and for the peer routers (skipped with the reason when those are not installed).
"""

from __future__ import annotations

import io
import time
from typing import Any

import aiohttp
import orjson
import pytest
from tqdm import tqdm

from bench import peers
from bench.compare import PlannedWorkload, SimScale, planned, run_sim_fleet
from bench.compare.comparison import CompareConfig, run_compare
from bench.compare.markdown import RunInfo, render_markdown
from bench.compare.overload import OVERLOAD_OBJECTIVE_TARGET
from bench.compare.plan import OVERLOAD
from bench.compare.results import (
    CACHE_AWARE_PEERS,
    GATEWAY_TARGETS,
    LEAST_LOADED,
    PREFIX_AWARE,
    ROUND_ROBIN,
    SGLANG_CA,
    FleetResult,
    Target,
    WorkloadInfo,
)
from bench.compare.runner import SimVariant, measuring_order, rehearse, run_targets
from bench.driver import run_conversations
from bench.replica_counters import delta, reset_and_verify, snapshot
from bench.workloads import Conversation, generated_shared_prefix
from tests.conftest import MODEL, running_sims

# --- against real sim processes -------------------------------------------------------------


async def _chat_once(url: str, content: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as response:
            assert response.status == 200
            usage = orjson.loads(await response.read())["usage"]
            return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def test_reset_empties_the_cache_and_counters_stand_still() -> None:
    async with running_sims(1) as sims:
        urls = [sims[0].url]
        prompt = "p" * 800
        await _chat_once(urls[0], prompt)
        assert await _chat_once(urls[0], prompt) > 0  # warm
        before = await reset_and_verify(urls)
        assert await _chat_once(urls[0], prompt) == 0  # emptied
        moved = delta(before, await snapshot(urls))[urls[0]]
        assert moved.requests == 1 and moved.cache.hits == 0


async def test_the_rehearsal_sends_every_request_to_every_replica_then_once_more_to_any() -> None:
    workload = _tiny_workload()
    async with running_sims(2, prefill_s_per_token=0, decode_step_s=0, decode_s_per_seq=0) as sims:
        urls = [sim.url for sim in sims]
        before = await snapshot(urls)
        await rehearse(urls, MODEL, [workload], timeout_s=30)
        moved = delta(before, await snapshot(urls))
    served = [moved[url].requests for url in urls]
    requests = workload.info.requests
    assert min(served) >= requests  # each replica saw every request one at a time
    assert sum(served) == 3 * requests  # and the open-loop pass sent each once more


def test_each_seed_measures_the_targets_starting_from_another() -> None:
    targets = [PREFIX_AWARE, LEAST_LOADED, ROUND_ROBIN, SGLANG_CA]
    orders = [measuring_order(targets, turn) for turn in range(len(targets))]
    assert orders[0] == targets
    assert [order[0] for order in orders] == targets
    assert all(sorted(order, key=targets.index) == targets for order in orders)
    assert measuring_order(targets, len(targets)) == targets


async def test_every_workload_a_fleet_runs_starts_from_another_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seeds of one workload and workloads run once (trace windows) alike: no target is
    always measured first on a fleet."""
    targets = [PREFIX_AWARE, LEAST_LOADED, SGLANG_CA]
    fleet = FleetResult("mooncake", "Mooncake", targets=targets)
    measured: list[tuple[str, Target]] = []

    async def measure(
        target: Target, workload: PlannedWorkload, *args: object, **kw: object
    ) -> None:
        measured.append((workload.info.key, target))

    monkeypatch.setattr("bench.compare.runner.measure", measure)
    keys = ["window-a", "window-b", "window-c", "window-d"]
    workloads = [
        PlannedWorkload(WorkloadInfo(key, key, "", "", 1, "open loop"), [], None) for key in keys
    ]
    await run_targets(fleet, [], MODEL, workloads, timeout_s=1.0, live=[], bar=None)
    firsts = [next(t for k, t in measured if k == key) for key in keys]
    assert firsts == [PREFIX_AWARE, LEAST_LOADED, SGLANG_CA, PREFIX_AWARE]
    assert len(measured) == len(keys) * len(targets)
    assert [w.key for w in fleet.workloads] == keys


async def test_the_overload_fleet_runs_the_gateway_told_the_objective_beside_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No target is told the objective, as the peers cannot be; the one told it is one more
    target of its own (counted in the progress bar), which the check does not read."""
    ran: dict[str, tuple[list[Target], int | None]] = {}

    async def run_sim_variant(
        variant: SimVariant,
        workloads: list[PlannedWorkload],
        targets: list[Target],
        *,
        bar: tqdm[Any],
        **kw: object,
    ) -> FleetResult:
        assert all(w.gateway_pool == {} for w in workloads)
        ran[variant.key] = (targets, bar.total)
        return FleetResult(variant.key, variant.title, targets=targets)

    monkeypatch.setattr("bench.compare.comparison.run_sim_variant", run_sim_variant)
    config = CompareConfig(
        fleet="sim", quick=True, out=None, peers=False, progress=False, workloads=(OVERLOAD,)
    )
    result = await run_compare(config, out=io.StringIO())
    targets, total = ran["overload"]
    assert targets == [*GATEWAY_TARGETS, OVERLOAD_OBJECTIVE_TARGET]
    assert total == len(targets)
    assert [c.name for c in result.checks] == ["overload: prefix-aware goodput >= every peer's"]


async def test_overload_runs_on_every_seed_so_its_check_reads_their_spread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One seed's arrivals move goodput by more than the targets differ: over five seeds the
    check can call a tie a tie."""
    seeds_run: list[int] = []

    async def run_sim_variant(
        variant: SimVariant, workloads: list[PlannedWorkload], targets: list[Target], **kw: Any
    ) -> FleetResult:
        seeds_run.extend(w.seed for w in workloads)
        return FleetResult(variant.key, variant.title, targets=targets)

    monkeypatch.setattr("bench.compare.comparison.run_sim_variant", run_sim_variant)
    config = CompareConfig(
        fleet="sim", out=None, peers=False, progress=False, workloads=(OVERLOAD,), seeds=(6, 7, 8)
    )
    await run_compare(config, out=io.StringIO())
    assert seeds_run == [6, 7, 8]


async def test_arrivals_schedule_the_conversations() -> None:
    workload = [Conversation(f"c{i}", i, f"system {i}", ("question",), 2) for i in range(3)]
    async with running_sims(1, prefill_s_per_token=0, decode_step_s=0, decode_s_per_seq=0) as sims:
        with pytest.raises(ValueError, match="arrival times"):
            await run_conversations(
                sims[0].url, workload, model=MODEL, arrivals=[0.0], progress=False
            )
        started = time.perf_counter()
        run = await run_conversations(
            sims[0].url, workload, model=MODEL, arrivals=[0.0, 0.2, 0.6], progress=False
        )
        assert time.perf_counter() - started >= 0.6
    assert [r.ok for r in run.results] == [True, True, True]
    assert [r.conversation for r in run.results] == ["c0", "c1", "c2"]
    assert run.results[0].messages == workload[0].request(0, []).messages


def _tiny_workload() -> PlannedWorkload:
    conversations = generated_shared_prefix(3, 4, 256, 16, 4, seed=2)
    return planned("gsp", "Tiny shared prefix", "test", "3 x 4", conversations, 8.0, seed=2)


def _assert_sane(fleet: FleetResult, targets: list[Target]) -> None:
    assert [m.target for m in fleet.measurements] == targets
    for m in fleet.measurements:
        assert (m.ok, m.errors) == (12, 0), m.first_error
        # Every request is found on exactly one replica's counters.
        assert sum(m.requests_per_replica) == 12
        # No routing can beat the bound: hits can only reuse blocks an earlier prompt computed.
        assert m.cache_hits <= m.bound.reusable_tokens
        assert m.bound.bound > 0.5


async def test_end_to_end_on_a_tiny_sim_fleet_gateway_targets() -> None:
    targets = list(GATEWAY_TARGETS)
    fleet = await run_sim_fleet([_tiny_workload()], targets, scale=SimScale.quick(), replicas=2)
    _assert_sane(fleet, targets)
    pa, rr = fleet.get("gsp", PREFIX_AWARE), fleet.get("gsp", ROUND_ROBIN)
    assert pa is not None and rr is not None
    assert rr.requests_per_replica == (6, 6)
    # Three groups on two replicas: round-robin computes each system prompt on both.
    assert (pa.hit_rate or 0) > (rr.hit_rate or 0)
    assert pa.routes and [(r.route, r.requests) for r in rr.routes] == [("round-robin", 12)]
    info = RunInfo("cmd", "git x", "now", "here", fleet.wall_s, "-")
    assert "| gateway least-loaded | 12/12 | 0 |" in render_markdown(info, [fleet], [], [], [], {})


async def test_end_to_end_on_a_tiny_sim_fleet_peers() -> None:
    reason = peers.peers_available()
    if reason is not None:
        pytest.skip(f"peer routers not installed: {reason}")
    targets = list(CACHE_AWARE_PEERS)
    fleet = await run_sim_fleet([_tiny_workload()], targets, scale=SimScale.quick(), replicas=2)
    _assert_sane(fleet, targets)
    assert all(m.routes == () for m in fleet.measurements)  # peers send no x-gateway-route
