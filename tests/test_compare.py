"""``bench compare``: the affinity bound, per-replica accounting, checks and report rendering on
hand-made figures, then one small end-to-end comparison on a tiny simulated fleet."""

from __future__ import annotations

import argparse
import io
import subprocess
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from bench import peers
from bench.affinity import AffinityBound, affinity_bound
from bench.cli import BENCHMARKS
from bench.compare import (
    CodeState,
    CompareConfig,
    PlannedWorkload,
    SimScale,
    code_line,
    planned,
    real_workloads,
    run_sim_fleet,
    sim_workloads,
    source_digest,
)
from bench.compare.cli import parse_seeds
from bench.compare.markdown import RunInfo, render_markdown, route_text
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
    summarize,
)
from bench.compare.runner import measuring_order, rehearse, run_targets
from bench.driver import RequestResult, RunResult, run_conversations
from bench.fleet_stats import CacheCounters
from bench.replica_counters import (
    ReplicaCounters,
    delta,
    max_over_mean,
    parse_replica_counters,
    reset_and_verify,
    snapshot,
)
from bench.workloads import Conversation, generated_shared_prefix
from replica.sim.tokenizer import render_chat
from tests.conftest import MODEL, running_sims

ROOT = Path(__file__).resolve().parents[1]

# --- the affinity bound -------------------------------------------------------------------


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_bound_counts_only_full_blocks_seen_in_an_earlier_prompt() -> None:
    # "<|system|>\n" is 11 characters: a 117-character system prompt makes the rendered
    # system part exactly 128 characters = 32 tokens = 2 blocks of 16 (4 characters a token).
    system = "s" * 117
    first, second = _chat(system, "a" * 200), _chat(system, "b" * 200)
    tokens = len(render_chat(first)) // 4 + (len(render_chat(first)) % 4 > 0)
    bound = affinity_bound([first, second])
    assert bound == AffinityBound(prompt_tokens=2 * tokens, reusable_tokens=32)
    assert bound.bound == pytest.approx(32 / (2 * tokens))


def test_bound_of_a_repeated_prompt_stops_before_its_last_token() -> None:
    # 64 tokens exactly: 4 full blocks, but vLLM recomputes the last token, so 3 can hit.
    prompt = [
        {
            "role": "user",
            "content": "x" * (256 - len(render_chat([{"role": "user", "content": ""}]))),
        }
    ]
    assert len(render_chat(prompt)) == 256
    assert affinity_bound([prompt, prompt]) == AffinityBound(128, 48)


def test_bound_is_zero_for_disjoint_prompts_and_no_prompts() -> None:
    assert affinity_bound([]).bound == 0.0
    disjoint = affinity_bound([_chat("a" * 400, "q"), _chat("b" * 400, "q")])
    assert disjoint.reusable_tokens == 0


def test_bound_of_a_workload_matches_its_shape() -> None:
    """Generated shared prefix: all but each group's first prompt reuse the system prompt."""
    workload = generated_shared_prefix(4, 5, 256, 32, 4, seed=1)
    bound = affinity_bound(c.request(0, []).messages for c in workload)
    # 16 of 20 prompts reuse ~the system prompt's 256+ tokens of ~292.
    assert 0.65 < bound.bound < 16 / 20


# --- per-replica accounting from counters --------------------------------------------------

SIM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 600.0
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{finished_reason="length",model_name="m"} 7.0
# TYPE vllm:request_success_created gauge
vllm:request_success_created{finished_reason="stop",model_name="m"} 1.7e9
"""


def test_parses_requests_cache_and_queue_from_one_exposition() -> None:
    counters = parse_replica_counters(SIM_METRICS)
    assert counters == ReplicaCounters(10.0, CacheCounters(1000.0, 600.0), 2.0, 1.0)
    assert not counters.idle


def test_per_replica_requests_are_counter_deltas() -> None:
    before = {
        "a": ReplicaCounters(10, CacheCounters(1000, 600)),
        "b": ReplicaCounters(5, CacheCounters(500, 100)),
    }
    after = {
        "a": ReplicaCounters(25, CacheCounters(4000, 3000)),
        # b restarted: its counters went back, and all it counted since is new.
        "b": ReplicaCounters(4, CacheCounters(300, 0)),
        # c is new: it counts all.
        "c": ReplicaCounters(6, CacheCounters(600, 60)),
    }
    moved = delta(before, after)
    assert [moved[k].requests for k in "abc"] == [15, 4, 6]
    assert moved["a"].cache == CacheCounters(3000, 2400)
    assert moved["b"].cache == CacheCounters(300, 0)
    assert max_over_mean([15, 4, 6, 3]) == pytest.approx(15 / 7)
    assert max_over_mean([5, 5]) == 1.0
    assert max_over_mean([0, 0]) is None
    assert max_over_mean([]) is None


def _result(
    ttft: float, latency: float, tokens: int, route: str, prompt: int = 0, cached: int = 0
) -> RequestResult:
    return RequestResult(
        200, latency, ttft, output_tokens=tokens, prompt_tokens=prompt, cached_tokens=cached,
        route=route,
    )  # fmt: skip


def test_summarize_takes_hits_and_requests_from_the_replicas() -> None:
    run = RunResult(
        (
            _result(0.1, 0.5, 5, route="prefix-hit", prompt=1000, cached=900),
            _result(0.2, 1.0, 9, route="prefix-hit", prompt=1000, cached=700),
            _result(0.3, 0.3, 1, route="prefix-home", prompt=2000, cached=0),
            RequestResult(503, 0.01, error="overloaded"),
        ),
        wall_s=2.0,
        planned=5,
    )
    counters = {
        "http://b": ReplicaCounters(1, CacheCounters(1000, 100)),
        "http://a": ReplicaCounters(2, CacheCounters(3000, 2900)),
    }
    m = summarize(
        PREFIX_AWARE, "w", run, counters, ["http://a", "http://b"], AffinityBound(4000, 3200)
    )
    assert (m.planned, m.sent, m.ok, m.errors, m.not_sent) == (5, 4, 3, 1, 1)
    assert m.first_error == "overloaded"
    assert m.requests_per_replica == (2, 1)
    assert m.prefilled_per_replica == (100, 900)  # queries less hits: the new text stored
    assert m.balance == pytest.approx(2 / 1.5)
    assert m.hit_rate == pytest.approx(3000 / 4000)
    assert m.hit_fraction_of_bound == pytest.approx(0.75 / 0.8)
    # ITL: (latency - TTFT) / (tokens - 1); a one-token answer has none.
    assert sorted(m.itls) == pytest.approx([0.1, 0.1])
    assert m.output_tokens == 15 and m.output_tokens_per_s == pytest.approx(7.5)
    assert m.ttft(50) == pytest.approx(0.2)
    # Per route: its requests, the share of their prompts served from cache, their TTFTs.
    hit, home = m.routes
    assert (hit.route, hit.requests, hit.hit_rate) == ("prefix-hit", 2, 0.8)
    assert hit.ttft(50) == pytest.approx(0.15)
    assert (home.route, home.requests, home.hit_rate, home.ttfts) == ("prefix-home", 1, 0, (0.3,))
    assert route_text(hit) == "prefix-hit 2 (hit 80.0%, 150 / 199 ms)"


# --- the workloads, the command line, the peers -------------------------------------------------


def test_default_sim_workloads_are_fixed_and_seeded() -> None:
    workloads = sim_workloads(SimScale())
    assert [w.info.key for w in workloads] == ["gsp", "mrqa", "low", "zipf"]
    assert [w.info.requests for w in workloads] == [512, 48 * 5, 512, 512]
    assert all(w.arrivals is not None for w in workloads)
    assert all(len(w.arrivals or ()) == len(w.conversations) for w in workloads)
    quick, again = sim_workloads(SimScale.quick()), sim_workloads(SimScale.quick())
    assert [(w.conversations, w.arrivals) for w in quick] == [
        (w.conversations, w.arrivals) for w in again
    ]
    assert sum(w.info.requests for w in quick) < sum(w.info.requests for w in workloads) / 4


def test_shared_prefix_and_zipf_run_on_every_seed_the_others_on_the_first() -> None:
    workloads = sim_workloads(SimScale.quick(), seeds=(0, 1, 2))
    assert [(w.info.key, w.seed) for w in workloads] == [
        ("gsp", 0), ("mrqa", 0), ("low", 0), ("zipf", 0),
        ("gsp", 1), ("zipf", 1), ("gsp", 2), ("zipf", 2),
    ]  # fmt: skip
    assert {w.info.key: w.info.seeds for w in workloads} == {
        "gsp": (0, 1, 2), "mrqa": (0,), "low": (0,), "zipf": (0, 1, 2),
    }  # fmt: skip
    gsp = [w for w in workloads if w.info.key == "gsp"]
    # Each seed draws its own text and arrivals.
    assert gsp[0].conversations[0].system != gsp[1].conversations[0].system
    assert gsp[0].arrivals != gsp[1].arrivals


def test_the_real_fleet_workload_runs_on_every_seed() -> None:
    workloads = real_workloads(False, seeds=(0, 1, 2))
    assert [(w.info.key, w.seed, w.info.seeds) for w in workloads] == [
        ("real-gsp", seed, (0, 1, 2)) for seed in (0, 1, 2)
    ]
    assert workloads[0].conversations[0].system != workloads[1].conversations[0].system


def test_compare_is_a_bench_subcommand_with_a_reproducible_command_line() -> None:
    assert BENCHMARKS["compare"][0] == "bench.compare"
    assert CompareConfig().command() == "llm-gateway bench compare --fleet all --out docs"
    assert (
        CompareConfig(fleet="sim", quick=True, out=None).command()
        == "llm-gateway bench compare --fleet sim --quick --no-out"
    )
    assert "--seeds 4,5" in CompareConfig(seeds=(4, 5)).command()
    assert parse_seeds("0, 1,2") == (0, 1, 2)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_seeds("one")


def test_code_line_says_whether_the_code_changed_during_the_run() -> None:
    start = CodeState("git aaa", "d1")
    assert (
        code_line(start, start)
        == "git aaa; sources of gateway, router_policies, replica, bench hash d1"
    )
    assert "committed as git bbb" in code_line(start, CodeState("git bbb", "d1"))
    assert "CHANGED during the run" in code_line(start, CodeState("git aaa", "d2"))
    assert len(source_digest()) == 12 and source_digest() == source_digest()


def test_peer_command_lines_follow_the_documented_flags() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    vllm = peers.peer_argv("vllm-router", "cache_aware", urls, 8001, 9001, Path("/venv"))
    assert vllm[0] == "/venv/bin/vllm-router"
    assert vllm[vllm.index("--worker-urls") + 1 : vllm.index("--worker-urls") + 3] == urls
    assert vllm[vllm.index("--prometheus-port") + 1] == "9001"
    assert vllm[vllm.index("--policy") + 1] == "cache_aware"
    sglang = peers.peer_argv("sglang-router", "round_robin", urls, 8002, 9002, Path("/venv"))
    assert sglang[:3] == ["/venv/bin/python", "-m", "sglang_router.launch_router"]
    assert sglang[sglang.index("--log-level") + 1] == "warn"
    with pytest.raises(ValueError):
        peers.peer_argv("sglang-router", "consistent_hash", urls, 1, 2)


def test_peers_missing_is_a_reason_not_an_error(tmp_path: Path) -> None:
    reason = peers.peers_available(tmp_path / "nothing")
    assert reason is not None and "install.sh" in reason


def test_install_script_parses() -> None:
    result = subprocess.run(
        ["bash", "-n", str(peers.INSTALL_SCRIPT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


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


def test_the_report_keeps_what_other_benchmarks_wrote_below_the_marker(tmp_path: Path) -> None:
    from bench.compare.cli import KEPT_MARKER, _kept_sections

    path = tmp_path / "benchmarks.md"
    assert _kept_sections(path) == ""  # no report yet
    path.write_text("# old compare report\n\n" + KEPT_MARKER + "\n\n## Instances\n| a |\n")
    assert _kept_sections(path) == "\n" + KEPT_MARKER + "\n\n## Instances\n| a |\n"
    path.write_text("# a report with no marker\n")
    assert _kept_sections(path) == ""


def test_a_fleet_that_raises_is_reported_as_failed_and_the_report_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.compare import cli, comparison

    async def dies(*args: object, **kwargs: object) -> FleetResult:
        raise RuntimeError("gateway not healthy at /ready")

    monkeypatch.setattr(comparison, "run_sim_variant", dies)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--fleet", "mooncake", "--no-peers", "--no-install", "--no-progress"]
    args = parser.parse_args([*argv, "--out", str(tmp_path)])
    assert cli.run(args, out=io.StringIO()) == 1
    report = (tmp_path / "benchmarks.md").read_text()
    assert "Not run: failed: RuntimeError('gateway not healthy at /ready')" in report


def test_workloads_narrow_the_simulated_fleets_to_the_named_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench.compare import cli, comparison

    planned: list[str] = []
    variants: list[str] = []

    async def sim_fleet(plan: list[PlannedWorkload], *args: object, **kwargs: object) -> None:
        planned.extend(w.info.key for w in plan)
        raise RuntimeError("not measured here")

    async def variant(v: object, plan: list[PlannedWorkload], *args: object, **kw: object) -> None:
        variants.extend(w.info.key for w in plan)
        raise RuntimeError("not measured here")

    monkeypatch.setattr(comparison, "run_sim_fleet", sim_fleet)
    monkeypatch.setattr(comparison, "run_sim_variant", variant)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--fleet", "sim", "--no-peers", "--no-install", "--no-progress", "--no-out"]
    args = parser.parse_args([*argv, "--workloads", "gsp", "--seeds", "6,7,8,9,10"])
    assert cli.run(args, out=io.StringIO()) == 1
    assert planned == ["gsp"] * 5
    assert variants == []  # neither agents, overload nor the Mooncake replay
    assert "--workloads gsp" in CompareConfig(workloads=("gsp",)).command()
    with pytest.raises(SystemExit):
        parser.parse_args(["--workloads", "gsp,nope"])
