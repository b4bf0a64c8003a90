"""Reading a vLLM replica's /metrics into EngineStats, with prometheus_client's own parser."""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.replicas import EngineStats
from replica.vllm_metrics import (
    CACHE_CONFIG,
    FORMER_NAMES,
    KV_USAGE,
    NUM_RUNNING,
    NUM_WAITING,
    PREFIX_CACHE_QUERIES,
    total,
)

_LOOKUPS = total(PREFIX_CACHE_QUERIES)
_FORMERLY = {
    KV_USAGE: FORMER_NAMES[KV_USAGE],
    _LOOKUPS: total(FORMER_NAMES[PREFIX_CACHE_QUERIES]),
}
"""Samples an older engine exports under another name, read there where the current one is
absent: unread, its figures would be 0, an idle-looking engine. (An engine of the release that
renamed them exports both.)"""
_WANTED = (
    NUM_RUNNING, NUM_WAITING, KV_USAGE, CACHE_CONFIG, PREFIX_CACHE_QUERIES,
    FORMER_NAMES[KV_USAGE], FORMER_NAMES[PREFIX_CACHE_QUERIES],
)  # fmt: skip


def _relevant_lines(text: str) -> str:
    # A vLLM exposition runs to hundreds of histogram lines; parsing only the four families
    # the router reads keeps the scrape off the event loop's critical path.
    keep = []
    for line in text.splitlines():
        body = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        if body.startswith(_WANTED):
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_engine_stats(text: str, last: EngineStats | None = None) -> EngineStats:
    """Sums over label sets (several served model names or LoRA adapters share one engine).
    Raises ValueError where ``text`` is not Prometheus's text format.

    A figure with a sample that is not a finite number >= 0 (NaN, inf, negative: a broken
    exporter) is not believed: it keeps its value from ``last``, the previous scrape's, as a
    missed scrape does. Taken as 0 it would pass for an idle engine; kept, it is at worst old.
    """
    last = EngineStats() if last is None else last
    named = (NUM_RUNNING, NUM_WAITING, KV_USAGE, _LOOKUPS, *_FORMERLY.values())
    samples: dict[str, list[float]] = {name: [] for name in named}
    capacity: int | None = None
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG:
                capacity = _kv_tokens(sample.labels)
            elif sample.name in samples:
                samples[sample.name].append(sample.value)
    for name, former in _FORMERLY.items():
        samples[name] = samples[name] or samples[former]
    lookups = samples[_LOOKUPS]  # absent: None, an engine that does not say
    return EngineStats(
        _believed(samples[NUM_RUNNING], sum, last.running),
        _believed(samples[NUM_WAITING], sum, last.waiting),
        _believed(samples[KV_USAGE], max, last.kv_usage),
        capacity,
        _believed(lookups, sum, last.prefix_lookups or 0.0) if lookups else None,
    )


def _believed(values: list[float], combine: Callable[[list[float]], float], last: float) -> float:
    if not values:
        return 0.0  # the family is absent: the engine does not export it
    if all(math.isfinite(v) and v >= 0 for v in values):
        return combine(values)
    return last


def _kv_tokens(labels: dict[str, str]) -> int | None:
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None
