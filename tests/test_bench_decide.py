"""bench decide --tokens: what routing on KV-cache events adds per request, measured against a
real simulated replica's /tokenize."""

from __future__ import annotations

from pathlib import Path

from bench import decide_tokens


async def test_the_tokens_table_times_every_prompt_size(tmp_path: Path) -> None:
    rows = await decide_tokens.measure(2, None, "tiny-llama", tmp_path / "no-tokenizer.json")
    assert [r.case for r in rows] == [case for case, _ in decide_tokens.SIZES]
    tokens = [r.tokens for r in rows]
    assert tokens == sorted(tokens) and tokens[0] > 1000  # ~4 characters a sim token
    assert all(r.sim_ms > 0 and r.keys_us > 0 for r in rows)
    assert all(r.in_process_ms is None and r.vllm_ms is None for r in rows)  # not asked for
    assert all(set(r.match_us) == set(decide_tokens.REPLICAS) for r in rows)
    table = "\n".join(decide_tokens.format_table(rows))
    assert table.count("\n| ") == len(rows) + 1 and "n/a" in table
