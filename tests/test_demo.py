"""The embedded demo, run for real: simulated replicas and gateways as subprocesses."""

from __future__ import annotations

import argparse

import pytest
import pytest_asyncio

import bench.demo as demo_module
from bench.demo import DemoConfig, DemoResult, PolicyRun, add_arguments, format_report, run_demo
from bench.driver import RequestResult, RunResult
from bench.fleet_stats import CacheCounters
from replica.processes import ManagedProcess, ProcessStartError
from tests.command_line import llm_gateway_process, parsed


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def demo() -> DemoResult:
    """One real run of the demo's defaults, shared by the tests below (it takes ~20 s)."""
    return await run_demo(DemoConfig())


@pytest.mark.timeout(240)
@pytest.mark.asyncio(loop_scope="module")
async def test_prefix_aware_at_least_doubles_round_robins_fleet_hit_rate(
    demo: DemoResult,
) -> None:
    assert demo.prefix_aware.fleet_hit_rate >= 2 * demo.round_robin.fleet_hit_rate
    assert demo.hit_rate_ratio >= 2


@pytest.mark.timeout(240)
@pytest.mark.asyncio(loop_scope="module")
async def test_every_request_of_both_policies_succeeds(demo: DemoResult) -> None:
    for run in (demo.prefix_aware, demo.round_robin):
        assert run.run.failed == 0, [r.error for r in run.run.results if not r.ok][:3]
        assert run.run.sent == run.run.planned == 8 * 4 * 4
        assert all(r.output_tokens == demo.config.answer_tokens for r in run.run.results)


@pytest.mark.timeout(240)
@pytest.mark.asyncio(loop_scope="module")
async def test_the_report_accounts_for_every_request_and_replica(demo: DemoResult) -> None:
    assert len(demo.replicas) == demo.config.replicas == 4
    for run in (demo.prefix_aware, demo.round_robin):
        assert set(run.requests_per_replica()) <= set(demo.replicas)
        assert sum(run.requests_per_replica().values()) == run.run.sent
        assert sum(run.routes().values()) == run.run.sent
        assert set(run.cache) == set(demo.replicas)
    assert set(demo.round_robin.routes()) == {"round-robin"}
    assert "prefix-hit" in demo.prefix_aware.routes()
    report = format_report(demo)
    assert f"{demo.hit_rate_ratio:.2f}x" in report
    assert all(name in report for name in demo.replicas)


def test_the_kv_cache_cannot_hold_every_system_prompt_on_one_replica() -> None:
    config = DemoConfig()
    assert config.kv_tokens < config.groups * config.system_tokens
    assert config.replicas * config.kv_tokens >= config.working_set_tokens


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--replicas", "0"),
        ("--groups", "0"),
        ("--users-per-group", "0"),
        ("--rounds", "-1"),
        ("--concurrency", "0"),
        ("--replicas", "two"),
    ],
)
def test_counts_below_1_are_refused_before_anything_starts(flag: str, value: str) -> None:
    parser = argparse.ArgumentParser(prog="llm-gateway demo")
    add_arguments(parser)
    assert parsed(parser, flag, value).refused(f"argument {flag}", value)


def test_a_baseline_with_no_hits_gives_no_infinite_ratio() -> None:
    # One round per user: nothing to reuse, round-robin hits nothing (and here neither does
    # prefix-aware, and no request succeeded: no TTFT either).
    config = DemoConfig(replicas=1, groups=1, users_per_group=1, rounds=1)
    run = RunResult((RequestResult(status=0, latency_s=1.0, error="refused"),), 1.0, 1)
    cold = {"r1": CacheCounters(queries=100.0, hits=0.0)}
    result = DemoResult(config, ("r1",), PolicyRun("prefix-aware", run, cold),
                        PolicyRun("round-robin", run, cold))  # fmt: skip
    report = format_report(result)
    assert "inf" not in report and "nan" not in report, report
    assert report.rstrip().endswith("0.0% vs round-robin 0.0%: -")


@pytest.mark.timeout(120)
def test_the_demo_shows_the_defaults_whatever_gateway_settings_the_shell_holds() -> None:
    """A shell set up for a real gateway (a bad log level here; a production Redis URL as
    likely) changes neither what the demo measures nor whether it starts."""
    done = llm_gateway_process(
        "demo", "--replicas", "1", "--groups", "1", "--users-per-group", "1", "--rounds", "1",
        "--no-progress", env={"GATEWAY_LOG_LEVEL": "verbose", "GATEWAY_WORKERS": "many"},
        timeout_s=100,
    )  # fmt: skip
    assert done.code == 0, done.err
    assert "Fleet prefix-cache hit rate" in done.out


def test_a_child_that_does_not_start_is_one_short_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = "\n".join(["Traceback (most recent call last):", *["  frame"] * 40, "OSError: no GPU"])

    async def failing(*args: object, **kwargs: object) -> list[ManagedProcess]:
        raise ProcessStartError(f"sim-replica-0 exited with 1 before it was healthy\n{log}\n")

    monkeypatch.setattr(demo_module, "start_sim_replicas", failing)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert demo_module.run(parser.parse_args([])) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in err[1:] and len(err) <= 5, err
    assert err[1].startswith("error: sim-replica-0 exited with 1 before it was healthy")
    assert err[-1].strip() == "OSError: no GPU"
