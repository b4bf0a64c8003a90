"""The tier decision's cost, as `llm-gateway tiers eval` reports it: p50 and p90 of the whole
decision (the classifier's score, the threshold, the conversation's tier memory) on prompts of
2 KB and 30 KB and on a long conversation, and the model's load time and memory."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.tier_eval.evaluation import Example
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings

TIMING_SIZES = (2048, 30_000)
TIMING_PROMPTS = 200
TIMING_TURNS = 20
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


def _percentiles(router: TierRouter, bodies: Sequence[dict[str, object]]) -> tuple[float, float]:
    for body in bodies:  # warm-up pass
        router.classify(body)
    times = []
    for body in bodies:
        t0 = time.perf_counter_ns()
        router.classify(body)
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return statistics.median(times) / 1000, times[int(len(times) * 0.9)] / 1000


_LOAD_PROBE = """
import sys, time
def rss_kib():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
import router_policies.tier_classifiers as t
before = rss_kib()
t0 = time.perf_counter()
model = t.load_learned(sys.argv[1] if len(sys.argv) > 1 else None)
elapsed = time.perf_counter() - t0
print(elapsed, (rss_kib() - before) / 1024, len(model.weights))
"""


def timing_report(model_path: str | None, corpus_of: Sequence[Example]) -> list[str]:
    """The Markdown section; ``corpus_of``: prompts whose text the timed requests are cut
    from."""
    args = [sys.executable, "-c", _LOAD_PROBE] + ([model_path] if model_path else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()
    load_s, rss_mib, n_features = float(out[0]), float(out[1]), int(out[2])
    # The whole tier decision, as a request meets it: the score, the threshold and the
    # conversation's tier memory (its key is hashed for every chat request).
    routers = [
        (name, TierRouter("auto", TierSettings(small="small", large="large", **chosen)))
        for name, chosen in (("learned", {"model": model_path}), ("cue", {"classifier": "cue"}))
    ]
    lines = [
        "### Decision time (one core, pure Python, CPython "
        f"{sys.version_info.major}.{sys.version_info.minor})",
        "",
        f"The tier decision (score, threshold, the conversation's tier memory), on "
        f"{TIMING_PROMPTS} distinct requests per row, each timed once after a warm-up pass.",
        "",
        "| request | classifier | p50 us | p90 us |",
        "|---|---|---:|---:|",
    ]
    sets = [(f"{n // 1000} KB prompt", _timing_bodies(n, corpus_of)) for n in TIMING_SIZES]
    label = f"{TIMING_TURNS} user turns and the answers between (1 KB each)"
    sets.append((label, _conversation_bodies(corpus_of)))
    for label, bodies in sets:
        for name, router in routers:
            p50, p90 = _percentiles(router, bodies)
            lines.append(f"| {label} | {name} | {p50:.0f} | {p90:.0f} |")
    lines += [
        "",
        f"Model load (fresh process): {load_s * 1000:.0f} ms; resident memory added: "
        f"{rss_mib:.1f} MiB; {n_features} weights.",
    ]
    return lines
