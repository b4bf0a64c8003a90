"""vLLM's own /metrics series names: what the simulated replica exports, the gateway scrapes
and the benchmarks count. Counters are exposed with a ``_total`` suffix (``total()``)."""

from __future__ import annotations

from typing import Final

NUM_RUNNING: Final = "vllm:num_requests_running"
NUM_WAITING: Final = "vllm:num_requests_waiting"
KV_USAGE: Final = "vllm:kv_cache_usage_perc"
"""0-1; the engine's share of KV blocks in use."""
CACHE_CONFIG: Final = "vllm:cache_config_info"
"""An info gauge whose labels carry block_size and num_gpu_blocks."""
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"
"""Counter of prompt tokens looked up in the prefix cache."""
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"
"""Counter of prompt tokens found there."""
EXTERNAL_PREFIX_CACHE_QUERIES: Final = "vllm:external_prefix_cache_queries"
"""Counter of prompt tokens a KV connector (a CPU tier) was asked for: those the GPU cache did
not hold (0 with no connector)."""
EXTERNAL_PREFIX_CACHE_HITS: Final = "vllm:external_prefix_cache_hits"
"""Counter of prompt tokens the connector loaded back: not among PREFIX_CACHE_HITS."""
PROMPT_TOKENS: Final = "vllm:prompt_tokens"
GENERATION_TOKENS: Final = "vllm:generation_tokens"
REQUEST_SUCCESS: Final = "vllm:request_success"
"""Counter of requests finished normally, by finished_reason."""
TTFT: Final = "vllm:time_to_first_token_seconds"
E2E_LATENCY: Final = "vllm:e2e_request_latency_seconds"
FORMER_NAMES: Final = {
    KV_USAGE: "vllm:gpu_cache_usage_perc",
    PREFIX_CACHE_QUERIES: "vllm:gpu_prefix_cache_queries",
    PREFIX_CACHE_HITS: "vllm:gpu_prefix_cache_hits",
}
"""The names these had before vLLM renamed them (about 0.10), which older engines still export."""


def total(counter: str) -> str:
    """A counter's sample name as exposed (and parsed back) in the text format."""
    return counter + "_total"
