"""Reading a vLLM replica's /metrics into EngineStats, with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.replicas import EngineStats
from replica.vllm_metrics import CACHE_CONFIG, KV_USAGE, NUM_RUNNING, NUM_WAITING

_WANTED = (NUM_RUNNING, NUM_WAITING, KV_USAGE, CACHE_CONFIG)


def _relevant_lines(text: str) -> str:
    # A vLLM exposition runs to hundreds of histogram lines; parsing only the four families
    # the router reads keeps the scrape off the event loop's critical path.
    keep = []
    for line in text.splitlines():
        body = line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line
        if body.startswith(_WANTED):
            keep.append(line)
    return "\n".join(keep) + "\n"


def parse_engine_stats(text: str) -> EngineStats:
    """Sums over label sets (several served model names or LoRA adapters share one engine)."""
    stats = EngineStats()
    kv_usage: list[float] = []
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            if sample.name == NUM_RUNNING:
                stats.running += sample.value
            elif sample.name == NUM_WAITING:
                stats.waiting += sample.value
            elif sample.name == KV_USAGE:
                kv_usage.append(sample.value)
            elif sample.name == CACHE_CONFIG:
                stats.kv_capacity_tokens = _kv_tokens(sample.labels)
    if kv_usage:
        stats.kv_usage = max(kv_usage)
    return stats


def _kv_tokens(labels: dict[str, str]) -> int | None:
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None
