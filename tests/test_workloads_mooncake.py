"""Reading a Mooncake trace into a schedule: prompts of each row's input length that share text
exactly where the rows share hash ids, the time window and the rate and length scales, the
trace's own block-reuse bound, and a bad line named by its number."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.workloads import CHARS_PER_TOKEN
from bench.workloads_mooncake import mooncake_schedule, read_trace, summarise

TINY_TRACE: list[dict[str, Any]] = [
    {"timestamp": 0, "input_length": 1200, "output_length": 40, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 1900, "output_length": 3, "hash_ids": [0, 1, 3, 4]},
    {"timestamp": 2500, "input_length": 100, "output_length": 9, "hash_ids": [5]},
    {"timestamp": 4000, "input_length": 600, "output_length": 12, "hash_ids": [0, 6]},
]


def _trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in TINY_TRACE) + "\n\n")
    return path


def test_trace_prompts_follow_input_length_and_share_blocks_by_id(tmp_path: Path) -> None:
    schedule = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125)
    prompts = [c.questions[0] for _, c in schedule]
    block = 512 // 8 * CHARS_PER_TOKEN  # 64 tokens x 4 characters
    assert [len(p) for p in prompts] == [r["input_length"] // 2 for r in TINY_TRACE]
    # Shared hash ids, byte-identical text; a different id, different text.
    assert prompts[0][: 2 * block] == prompts[1][: 2 * block] == schedule[0][1].questions[0][: 2 * block]  # fmt: skip
    assert prompts[0][2 * block : 2 * block + 20] != prompts[1][2 * block : 2 * block + 20]
    assert prompts[3][:block] == prompts[0][:block]
    assert prompts[3][block:] != prompts[0][block : len(prompts[3])]
    assert prompts[2] != prompts[0][: len(prompts[2])]
    # One user message, no system prompt; max_tokens scales with the lengths, at least 1.
    assert schedule[0][1].request(0, []).messages == ({"role": "user", "content": prompts[0]},)
    assert [c.max_tokens for _, c in schedule] == [5, 1, 1, 2]
    assert [c.group for _, c in schedule] == [0, 0, 5, 0]


def test_trace_window_and_rate_scale(tmp_path: Path) -> None:
    schedule = mooncake_schedule(
        _trace_file(tmp_path), start_s=1.0, end_s=4.0, rate_scale=2.0, length_scale=0.125
    )
    assert [(at, c.id) for at, c in schedule] == [(0.25, "m000001"), (0.75, "m000002")]
    capped = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125, max_requests=2)
    assert len(capped) == 2
    # Same ids, same text, whatever the window.
    whole = mooncake_schedule(_trace_file(tmp_path), length_scale=0.125)
    assert schedule[0][1].questions == whole[1][1].questions


def test_trace_summary_is_the_traces_own_bound(tmp_path: Path) -> None:
    summary = summarise(read_trace(_trace_file(tmp_path)))
    assert (summary.requests, summary.span_s) == (4, 4.0)
    assert summary.mean_input_tokens == pytest.approx(3800 / 4)
    # Reused leading blocks: 0 + 2 (ids 0, 1) + 0 + 1 (id 0), over 3 + 4 + 1 + 2 blocks.
    assert summary.block_reuse == pytest.approx(3 / 10)


def test_a_bad_trace_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{"x": 1}\n')  # fmt: skip
    with pytest.raises(ValueError, match=":2:"):
        list(read_trace(path))
