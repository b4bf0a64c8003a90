"""The Mooncake trace replay: the committed window, how it is cut and scaled, the trace's own
bound, and how the report shows it. Nothing runs: ``bench compare`` runs the workload."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench.affinity import AffinityBound, affinity_bound
from bench.compare import mooncake
from bench.compare.markdown import fleet_section
from bench.compare.mooncake import (
    LENGTH_SCALE,
    OUTPUT_SCALE,
    RATE_SCALE,
    REPORT_WINDOWS,
    SHIPPED,
    SHIPPED_WINDOW,
    TRACE_FILES,
    TTFT_OBJECTIVE_S,
    TUNING_WINDOWS,
    TraceWindow,
    mooncake_config,
    mooncake_workload,
    parse_window,
    trace_path,
    window_records,
)
from bench.compare.phases import PhaseFigures
from bench.compare.results import PREFIX_AWARE, SGLANG_CA, FleetResult, Measurement, WorkloadInfo
from bench.workloads import CHARS_PER_TOKEN
from bench.workloads_mooncake import (
    TraceRecord,
    lru_reuse,
    mooncake_schedule,
    read_trace,
    summarise,
)


def rec(at_ms: int, tokens: int, *ids: int, out: int = 10) -> TraceRecord:
    return TraceRecord(at_ms, tokens, out, ids)


def write(tmp_path: Path, records: list[TraceRecord], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    rows: list[dict[str, Any]] = [
        {"timestamp": r.timestamp_ms, "input_length": r.input_length,
         "output_length": r.output_length, "hash_ids": list(r.hash_ids)}
        for r in records
    ]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


TRACE = [
    rec(10_000, 1024, 0, 1, out=64),
    rec(11_000, 1536, 0, 1, 2, out=32),
    rec(12_500, 700, 0, 3, out=1),
    rec(14_000, 512, 4, out=100),
]


# --- cutting and scaling -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "rate", "length", "output", "arrivals", "prompt_tokens", "max_tokens"),
    [
        # The whole trace at its own pace and size: offsets from start_s.
        (
            (10.0, 20.0),
            1.0,
            1.0,
            None,
            [0.0, 1.0, 2.5, 4.0],
            [1024, 1536, 700, 512],
            [64, 32, 1, 100],
        ),
        # 10x faster, lengths x 3/16, outputs x 3/32 (at least one token).
        (
            (10.0, 20.0),
            10.0,
            0.1875,
            0.09375,
            [0.0, 0.1, 0.25, 0.4],
            [192, 288, 131, 96],
            [6, 3, 1, 9],
        ),
        # A window keeps start_s <= timestamp < end_s, offsets from its own start.
        ((11.0, 14.0), 2.0, 0.25, None, [0.0, 0.75], [384, 175], [8, 1]),
        # Outputs follow the lengths unless told otherwise.
        ((14.0, 15.0), 1.0, 0.5, None, [0.0], [256], [50]),
    ],
)
def test_a_window_is_cut_by_timestamp_and_scaled_in_rate_and_length(
    tmp_path: Path,
    window: tuple[float, float],
    rate: float,
    length: float,
    output: float | None,
    arrivals: list[float],
    prompt_tokens: list[int],
    max_tokens: list[int],
) -> None:
    schedule = mooncake_schedule(
        write(tmp_path, TRACE),
        start_s=window[0],
        end_s=window[1],
        rate_scale=rate,
        length_scale=length,
        output_scale=output,
    )
    assert [at for at, _ in schedule] == pytest.approx(arrivals)
    assert [len(c.questions[0]) // CHARS_PER_TOKEN for _, c in schedule] == prompt_tokens
    assert [c.max_tokens for _, c in schedule] == max_tokens


def test_shared_block_ids_share_bytes_at_any_scale(tmp_path: Path) -> None:
    for length in (0.1875, 0.5):
        prompts = [c.questions[0] for _, c in mooncake_schedule(write(tmp_path, TRACE), length_scale=length)]  # fmt: skip
        block = round(512 * length * CHARS_PER_TOKEN)
        assert prompts[1][: 2 * block] == prompts[0]  # ids 0, 1
        assert prompts[2][:block] == prompts[0][:block]  # id 0
        assert prompts[2][block:] != prompts[0][block : len(prompts[2])]  # id 3, not 1
        assert prompts[3][:50] != prompts[0][:50]  # id 4


# --- the trace's own bound -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "blocks", "tokens"),
    [
        # Nothing shared: nothing to reuse.
        ([rec(0, 1024, 0, 1), rec(1, 512, 2)], 0 / 3, 0 / 1536),
        # The same prompt twice: the second is all hits.
        ([rec(0, 1024, 0, 1), rec(1, 1024, 0, 1)], 2 / 4, 1024 / 2048),
        # A partial last block counts its own tokens, not 512.
        ([rec(0, 600, 0, 1), rec(1, 600, 0, 1)], 2 / 4, 600 / 1200),
        # Ids are chained: a known id after an unknown one is no prefix hit.
        ([rec(0, 1024, 0, 1), rec(1, 1024, 2, 1)], 0 / 4, 0 / 2048),
        # A longer prompt over a shorter one's blocks hits on those only.
        ([rec(0, 512, 0), rec(1, 1300, 0, 1, 2)], 1 / 4, 512 / 1812),
    ],
)
def test_the_trace_bound_is_the_leading_run_of_earlier_seen_block_ids(
    records: list[TraceRecord], blocks: float, tokens: float
) -> None:
    summary = summarise(records)
    assert summary.block_reuse == pytest.approx(blocks)
    assert summary.token_reuse == pytest.approx(tokens)


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        (0, 0.0),  # no cache, no hits
        (2, 0.0),  # ids 0, 1 are evicted by 2, 3 before they come back
        (4, 1024 / 4096),  # everything fits: the unbounded bound
        (100, 1024 / 4096),
    ],
)
def test_an_lru_cache_of_the_fleets_size_reaches_the_bound_only_when_it_holds_the_working_set(
    capacity: int, expected: float
) -> None:
    records = [rec(0, 1024, 0, 1), rec(1, 1024, 2, 3), rec(2, 1024, 0, 1), rec(3, 1024, 4, 5)]
    assert lru_reuse(records, capacity) == pytest.approx(expected)
    assert lru_reuse(records, 100) == pytest.approx(summarise(records).token_reuse)


# --- the committed window and the workload -------------------------------------------------------


def test_the_committed_window_is_the_five_minutes_its_readme_describes() -> None:
    records = list(read_trace(SHIPPED))
    assert len(records) == 1023
    assert all(29 * 60 <= r.timestamp_ms / 1000 < 34 * 60 for r in records)
    summary = summarise(records)
    assert round(100 * summary.token_reuse, 1) == 19.8
    assert round(summary.mean_input_tokens) == 11232
    readme = (SHIPPED.parent / "README.md").read_text()
    assert "Apache License 2.0" in readme and "3b5a59413" in readme
    assert "Apache License" in (SHIPPED.parent / "LICENSE-APACHE").read_text()


def test_the_workload_replays_the_window_at_its_timestamps_and_fits_the_fleet() -> None:
    workload = mooncake_workload(quick=True)
    records = window_records(SHIPPED_WINDOW, SHIPPED, quick=True)
    assert workload.info.key == "mooncake-conversation-29-34"
    assert workload.info.requests == len(records) == 209
    assert workload.arrivals == pytest.approx(
        [(r.timestamp_ms / 1000 - 29 * 60) / RATE_SCALE for r in records]
    )
    for record, conversation in zip(records, workload.conversations, strict=True):
        tokens = len(conversation.questions[0]) / CHARS_PER_TOKEN
        assert tokens == pytest.approx(record.input_length * LENGTH_SCALE, abs=1)
        assert conversation.max_tokens == max(1, round(record.output_length * OUTPUT_SCALE))
    # Every request fits one replica's context and KV cache, with room for its answer.
    config = mooncake_config()
    # The synthetic trace's longest prompt is 191,378 tokens, the conversation trace's 126,195.
    longest = 191_378 * LENGTH_SCALE + 64 + 2000 * OUTPUT_SCALE
    assert longest < min(config.max_model_len, config.num_blocks * config.block_size)
    # Goodput is counted against the objective, which no target is told (like for like).
    assert workload.phases is not None and workload.phases.ttft_objective_s == TTFT_OBJECTIVE_S
    assert workload.gateway_pool == {}


def test_a_window_is_named_by_its_trace_and_minutes() -> None:
    assert parse_window("conversation:29-34") == SHIPPED_WINDOW
    assert parse_window("14-19") == TraceWindow("conversation", 14, 19)
    assert parse_window("synthetic:10-15").key == "mooncake-synthetic-10-15"
    for bad in ("toolagent:0-5", "conversation:34-29", "conversation:5", "x-y"):
        with pytest.raises(argparse.ArgumentTypeError, match="TRACE:START-END"):
            parse_window(bad)


def test_the_tuning_and_report_sets_share_no_minute() -> None:
    def minutes(w: TraceWindow) -> set[tuple[str, int]]:
        return {(w.trace, m) for m in range(int(w.start_min), int(w.end_min))}

    tuned = set().union(*map(minutes, TUNING_WINDOWS))
    assert SHIPPED_WINDOW in REPORT_WINDOWS
    assert all(not minutes(w) & tuned for w in REPORT_WINDOWS)
    assert {w.trace for w in REPORT_WINDOWS} == set(TRACE_FILES)


def test_a_window_outside_the_shipped_one_reads_the_whole_trace_it_is_given(
    tmp_path: Path,
) -> None:
    with pytest.raises(FileNotFoundError, match="--traces"):
        trace_path(TraceWindow("conversation", 14, 19), None)
    assert trace_path(TraceWindow("conversation", 30, 31), None) == SHIPPED
    records = [rec(60_000 * m + 5, 1024, m, m + 100) for m in range(20)]
    write(tmp_path, records, "conversation_trace.jsonl")
    window = TraceWindow("conversation", 14, 19)
    workload = mooncake_workload(window, traces=str(tmp_path))
    assert workload.info.requests == 5 and workload.info.key == window.key
    assert workload.arrivals == pytest.approx([m * 6.0 + 0.0005 for m in range(5)])
    quick = mooncake_workload(window, traces=str(tmp_path), quick=True)
    assert quick.info.requests == 1
    with pytest.raises(FileNotFoundError, match=r"synthetic_trace\.jsonl"):
        trace_path(TraceWindow("synthetic", 0, 5), str(tmp_path))


def test_the_affinity_bound_over_the_prompts_sent_is_the_traces_own() -> None:
    workload = mooncake_workload(quick=True)
    sent = affinity_bound(c.request(0, []).messages for c in workload.conversations)
    assert workload.info.trace_bound is not None
    assert sent.bound == pytest.approx(workload.info.trace_bound, abs=0.005)


def test_the_report_shows_the_trace_bound_and_one_goodput_row_per_target() -> None:
    info = WorkloadInfo(
        SHIPPED_WINDOW.key, "Mooncake", "def", "params", 100, "trace", trace_bound=0.2
    )
    fleet = FleetResult("mooncake", "Mooncake trace replay", ["- sims"], [info], [PREFIX_AWARE, SGLANG_CA])  # fmt: skip
    for target, hits, good in ((PREFIX_AWARE, 150.0, 90), (SGLANG_CA, 100.0, 80)):
        replay = PhaseFigures("replay (30 s)", 30.0, 100, good, 0.4)
        fleet.measurements.append(
            Measurement(
                target, SHIPPED_WINDOW.key, 100, 100, 0, 30.0, (0.1,), (0.2,), (0.01,), 100, 1000.0,
                hits, (50.0, 50.0), AffinityBound(1000, 200),
                phases=(replay, replace_name(replay, "all")),
            )
        )  # fmt: skip
    text = "\n".join(fleet_section(fleet, []))
    assert (
        "- The trace's own bound (its block ids): 20.0%; hit / trace bound: "
        "gateway prefix-aware 0.75, sglang-router cache_aware 0.50." in text
    )
    assert "| gateway prefix-aware | replay (30 s) | 100 | 90 | 3.00 | 400 |" in text
    assert "| all |" not in text  # one phase: its whole-run row would repeat it


def replace_name(phase: PhaseFigures, name: str) -> PhaseFigures:
    return PhaseFigures(name, phase.duration_s, phase.arrived, phase.good, phase.ttft_p99_s)


def test_download_fetches_a_trace_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    write(upstream, [rec(600_000, 1024, 0, 1)], "synthetic_trace.jsonl")
    monkeypatch.setattr(mooncake, "TRACES_URL", upstream.as_uri() + "/")
    monkeypatch.setattr(mooncake, "CACHE_DIR", tmp_path / "cache")
    window = TraceWindow("synthetic", 10, 15)
    path = trace_path(window, "download")
    assert path == tmp_path / "cache" / "synthetic_trace.jsonl"
    (upstream / "synthetic_trace.jsonl").unlink()  # a second run reads the cached copy
    assert trace_path(window, "download") == path
    assert mooncake_workload(window, traces="download").info.requests == 1
