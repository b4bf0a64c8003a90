"""`llm-gateway bench`'s arguments: a value that would crash a benchmark, or let it "succeed"
having done nothing, is refused while parsing (one line naming the flag, exit 2), and a trace
file that is not there is one `error:` line before anything starts.

The refusals are checked on each benchmark's parser alone: a value it wrongly accepted must
not start the benchmark (some write their reports under docs/)."""

from __future__ import annotations

import pytest

from bench.cli import main
from tests.command_line import bench_parser, in_process, parsed

WINDOW = ["--window", "conversation:29-34"]

BAD = [
    ("decide", ["--repeats", "0"], "--repeats"),
    ("instances", ["--seeds", "x"], "--seeds"),
    ("instances", ["--seeds", ""], "--seeds"),
    ("instances", ["--replicas", "0"], "--replicas"),
    ("instances", ["--instances", "0"], "--instances"),
    ("instances", ["--instances", "1,4"], "--instances"),
    ("instances", ["--instances", "two"], "--instances"),
    ("instances", ["--unshared", "0"], "--unshared"),
    ("instances", ["--workers", "-2"], "--workers"),
    ("close-calls", ["--seeds", "a"], "--seeds"),
    ("close-calls", ["--conversations", "0"], "--conversations"),
    ("close-calls", ["--rate", "0"], "--rate"),
    ("close-calls", ["--context-tokens", "-1"], "--context-tokens"),
    ("close-calls", ["--margin", "-0.1"], "--margin"),
    ("overflow", ["--small-replicas", "0"], "--small-replicas"),
    ("overflow", ["--large-replicas", "0"], "--large-replicas"),
    ("overflow", ["--seeds", "1,x"], "--seeds"),
    ("overflow", ["--conversations", "-3"], "--conversations"),
    ("overflow", ["--rate", "nan"], "--rate"),
    ("diagnose", ["--window", "bogus"], "--window"),
    ("diagnose", [*WINDOW, "--runs", "0"], "--runs"),
    ("diagnose", [*WINDOW, "--targets", "prefix-aware,nope"], "--targets"),
    ("diagnose", [*WINDOW, "--set", "no-equals-sign"], "--set"),
    ("diagnose", [*WINDOW, "--sim", "=1"], "--sim"),
    ("placement", ["--window", "x:1-2"], "--window"),
    ("placement", [*WINDOW, "--seeds", "0"], "--seeds"),
    ("placement", [*WINDOW, "--jitter", "2"], "--jitter"),
    ("priority", ["--seconds", "-1"], "--seconds"),
    ("priority", ["--load", "0"], "--load"),
    ("priority", ["--objective-s", "0"], "--objective-s"),
    ("soak", ["--duration-s", "0"], "--duration-s"),
    ("soak", ["--duration-s", "-5"], "--duration-s"),
    ("soak", ["--duration-s", "inf"], "--duration-s"),
    ("soak", ["--concurrency", "0"], "--concurrency"),
    ("soak", ["--requests", "-1"], "--requests"),
    ("soak", ["--replicas", "0"], "--replicas"),
    ("soak", ["--tenants", "0"], "--tenants"),
    ("soak", ["--sample-every-s", "0"], "--sample-every-s"),
    ("hang", ["--clients", "0"], "--clients"),
    ("hang", ["--before-s", "0"], "--before-s"),
    ("hang", ["--after-s", "-1"], "--after-s"),
    ("hang", ["--client-timeout-s", "0"], "--client-timeout-s"),
    ("profile", ["--requests", "0"], "--requests"),
    ("profile", ["--rate", "0"], "--rate"),
    ("profile", ["--concurrency", "0"], "--concurrency"),
    ("overhead", ["--requests", "0"], "--requests"),
    ("overhead", ["--concurrency", "0"], "--concurrency"),
    ("overhead", ["--rounds", "0"], "--rounds"),
    ("overhead", ["--unloaded-requests", "-1"], "--unloaded-requests"),
    ("overhead", ["--max-tokens", "0"], "--max-tokens"),
    ("overhead", ["--workers", "0"], "--workers"),
    ("overhead", ["--chunk-tokens", "-1"], "--chunk-tokens"),
    ("tiers", ["--target-share", "2"], "--target-share"),
]


@pytest.mark.parametrize(
    ("benchmark", "args", "flag"), BAD, ids=[f"{b} {' '.join(a)}" for b, a, _ in BAD]
)
def test_a_bad_value_is_refused_while_parsing(benchmark: str, args: list[str], flag: str) -> None:
    ran = parsed(bench_parser(benchmark), *args)
    assert ran.refused(f"argument {flag}"), ran.err


@pytest.mark.parametrize(
    ("benchmark", "args"),
    [
        ("instances", ["--instances", "", "--unshared", "", "--workers", "", "--seeds", "3,4"]),
        ("soak", ["--requests", "0", "--duration-s", "0.5"]),
        ("overhead", ["--unloaded-requests", "0", "--chunk-tokens", "0"]),
        ("close-calls", ["--context-tokens", "0", "--margin", "0"]),
        ("placement", [*WINDOW, "--jitter", "0"]),
        ("diagnose", [*WINDOW, "--targets", "prefix-aware,vllm-router", "--set", "a.b=1"]),
    ],
)
def test_values_that_mean_something_are_still_taken(benchmark: str, args: list[str]) -> None:
    ran = parsed(bench_parser(benchmark), *args)
    assert ran.code == 0, ran.err


@pytest.mark.parametrize(
    "args",
    [
        ["diagnose", *WINDOW, "--traces", "/nonexistent"],
        ["placement", *WINDOW, "--traces", "/nonexistent"],
        # --no-peers --no-install: nothing is installed should the check come too late.
        ["compare", "--fleet", "mooncake", "--traces", "/nonexistent", "--no-out", "--no-peers",
         "--no-install", "--no-progress"],
    ],
    ids=lambda args: args[0],
)  # fmt: skip
def test_a_missing_trace_is_one_line_before_anything_starts(args: list[str]) -> None:
    ran = in_process(main, *args)
    assert ran.refused("trace"), ran.err
    assert len(ran.err.strip().splitlines()) == 1, ran.err
