"""The tier decision's cost, as `llm-gateway tiers eval` reports it: p50 and p90 of the whole
decision (the classifier's score, the threshold, the conversation's tier memory) on prompts of
2 KB and 30 KB and on a long conversation, and the model's load time and memory.

Both are measured in fresh processes, as a gateway's, not in the evaluation's own, whose heap
holds every data set it read."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.tier_eval.evaluation import Example, load_examples
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings

TIMING_SIZES = (2048, 30_000)
TIMING_PROMPTS = 200
TIMING_TURNS = 20
TIMING_PASSES = 5
TIMING_PROCESSES = 3
"""Fresh processes, each timing every row in TIMING_PASSES passes. On a shared VM the same
process runs 2x slower from one minute to the next (docs/tier-eval.md): noise only adds, so the
report gives the lowest process's median pass, and the range of every pass."""
SEED = 9


def _timing_bodies(size: int, corpus_of: Sequence[Example]) -> list[dict[str, object]]:
    """TIMING_PROMPTS distinct prompts of ``size`` characters: windows of the public prompts'
    text laid end to end, so every prompt has real words."""
    corpus = "\n\n".join(str(e.body["messages"][-1]["content"]) for e in corpus_of)
    rng = random.Random(SEED)
    starts = [rng.randrange(0, len(corpus) - size) for _ in range(TIMING_PROMPTS)]
    return [
        {"model": "auto", "messages": [{"role": "user", "content": corpus[s : s + size]}]}
        for s in starts
    ]


def _conversation_bodies(corpus_of: Sequence[Example]) -> list[dict[str, object]]:
    """TIMING_PROMPTS distinct conversations of TIMING_TURNS user turns with the assistant's
    answers between them, every message 1 KB."""
    texts = [str(b["messages"][0]["content"]) for b in _timing_bodies(1024, corpus_of)]  # type: ignore[index]
    rng = random.Random(SEED)
    count = 2 * TIMING_TURNS - 1
    roles = ["assistant" if i % 2 else "user" for i in range(count)]
    return [
        {
            "model": "auto",
            "messages": [
                {"role": r, "content": t}
                for r, t in zip(roles, rng.sample(texts, count), strict=True)
            ],
        }
        for _ in range(TIMING_PROMPTS)
    ]


def _percentiles(
    router: TierRouter, bodies: Sequence[dict[str, object]]
) -> list[tuple[float, float]]:
    """(p50, p90) in microseconds of each of TIMING_PASSES passes, after a warm-up pass."""
    for body in bodies:
        router.classify(body)
    passes = []
    for _ in range(TIMING_PASSES):
        times = []
        for body in bodies:
            t0 = time.perf_counter_ns()
            router.classify(body)
            times.append(time.perf_counter_ns() - t0)
        times.sort()
        passes.append((statistics.median(times) / 1000, times[int(len(times) * 0.9)] / 1000))
    return passes


def _passes(model_path: str | None, corpus_of: Sequence[Example]) -> list[dict[str, object]]:
    """Each row's passes; ``corpus_of``: prompts whose text the timed requests are cut from."""
    # The whole tier decision, as a request meets it: the score, the threshold and the
    # conversation's tier memory (its key is hashed for every chat request).
    routers = [
        (name, TierRouter("auto", TierSettings(small="small", large="large", **chosen)))
        for name, chosen in (("learned", {"model": model_path}), ("cue", {"classifier": "cue"}))
    ]
    sets = [(f"{n // 1000} KB prompt", _timing_bodies(n, corpus_of)) for n in TIMING_SIZES]
    label = f"{TIMING_TURNS} user turns and the answers between (1 KB each)"
    sets.append((label, _conversation_bodies(corpus_of)))
    rows: list[dict[str, object]] = []
    for label, bodies in sets:
        for name, router in routers:
            passes = _percentiles(router, bodies)
            rows.append({"row": f"{label} | {name}", "passes": passes})
    return rows


_LOAD_PROBE = """
import sys, time
def rss_kib():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
import router_policies.tier_classifiers as t
before = rss_kib()
t0 = time.perf_counter()
model = t.load_learned(None if sys.argv[1] == "-" else sys.argv[1])
elapsed = time.perf_counter() - t0
print(elapsed, (rss_kib() - before) / 1024, len(model.weights))
"""
_SHIPPED = "-"
"""The model argument that names the shipped model (to the probe above and to this module)."""


def _fresh(args: list[str]) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def timing_report(model_path: str | None, corpus_files: Sequence[Path]) -> list[str]:
    """The Markdown section; ``corpus_files``: public prompts the timed requests are cut from."""
    model = model_path or _SHIPPED
    load_s, rss_mib, n_features = _fresh([sys.executable, "-c", _LOAD_PROBE, model]).split()
    timing = [sys.executable, "-m", "bench.tier_eval.timing", model]
    runs = [json.loads(_fresh([*timing, *map(str, corpus_files)])) for _ in range(TIMING_PROCESSES)]
    lines = [
        "### Decision time (one core, pure Python, CPython "
        f"{sys.version_info.major}.{sys.version_info.minor})",
        "",
        f"The tier decision (score, threshold, the conversation's tier memory) on "
        f"{TIMING_PROMPTS} distinct requests per row, in {TIMING_PROCESSES} fresh processes "
        f"(as a gateway's), each timing {TIMING_PASSES} passes after a warm-up pass. p50 and p90: "
        "the lowest of the processes' median passes; the range: every pass's p50.",
        "",
        "| request | classifier | p50 us | p90 us | p50 range us |",
        "|---|---|---:|---:|---:|",
    ]
    for rows in zip(*runs, strict=True):
        # Per process, the median pass's p50 and p90; the lowest process's is the least noisy.
        medians = [
            [statistics.median(column) for column in zip(*row["passes"], strict=True)]
            for row in rows
        ]
        p50s = [p50 for row in rows for p50, _ in row["passes"]]
        p50, p90 = min(medians)
        lines.append(
            f"| {rows[0]['row']} | {p50:.0f} | {p90:.0f} | {min(p50s):.0f}-{max(p50s):.0f} |"
        )
    return [
        *lines,
        "",
        f"Model load (fresh process): {float(load_s) * 1000:.0f} ms; resident memory added: "
        f"{float(rss_mib):.1f} MiB; {n_features} weights.",
    ]


if __name__ == "__main__":
    # python -m bench.tier_eval.timing MODEL CORPUS.jsonl...: each row's passes, as JSON.
    model_arg, *files = sys.argv[1:]
    corpus = [e for f in files for e in load_examples(f)]
    print(json.dumps(_passes(None if model_arg == _SHIPPED else model_arg, corpus)))
