"""``bench compare``'s plan and command line, nothing measured: the fixed, seeded workloads and
which of them run on every seed, the reproducible command line and its flags, the code line that
tells whether the code changed during a run, the peer routers' command lines and install check,
the report keeping what other benchmarks wrote below its marker, a fleet that raises reported as
failed with the report still written, and ``--workloads`` narrowing the simulated fleets.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pytest

from bench import peers
from bench.cli import BENCHMARKS
from bench.compare import (
    CodeState,
    CompareConfig,
    PlannedWorkload,
    SimScale,
    code_line,
    real_workloads,
    sim_workloads,
    source_digest,
)
from bench.compare.cli import parse_seeds
from bench.compare.results import FleetResult

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
