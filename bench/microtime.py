"""Timing a call in this process: repeated after a warm-up, in microseconds (bench decide)."""

from __future__ import annotations

import time
from collections.abc import Callable


def samples_us(call: Callable[[], object], repeats: int, warm: int) -> list[float]:
    """``repeats`` timings of ``call``, after ``warm`` untimed calls (caches, the allocator)."""
    for _ in range(warm):
        call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples
