"""Reading a vLLM /metrics page the way the gateway's scraper does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.fleet.kv_event_stream import EventStream
from gateway.fleet.pools import PoolState, ReplicaState
from gateway.fleet.replicas import EngineStats
from gateway.fleet.scrape import parse_engine_stats
from gateway.relay.usage import PromptUsage
from replica.sim.kv_events import block_removed, block_stored
from router_policies.cost.ttft import queued_tokens
from router_policies.fingerprint import CanonicalPrompt
from router_policies.schema import PoolPolicy
from tests.kv_events import payload

# Shaped like vLLM 0.x output: colons in names, a model_name label, histograms around.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="2000"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="llama"} 5.0
vllm:time_to_first_token_seconds_count{model_name="llama"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="llama"} 0.6
"""


def test_engine_figures_are_read() -> None:
    stats = parse_engine_stats(VLLM_METRICS)
    assert (stats.running, stats.waiting, stats.kv_usage) == (3.0, 7.0, 0.42)
    assert stats.kv_capacity_tokens == 32_000


def test_missing_families_leave_defaults() -> None:
    stats = parse_engine_stats("# nothing here\n")
    assert (stats.running, stats.waiting, stats.kv_capacity_tokens) == (0.0, 0.0, None)
    assert stats.prefix_lookups is None


def test_the_prefix_cache_lookups_counter_is_read_over_its_engines() -> None:
    counter = (
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1200.0\n'
        'vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.7e9\n'
        'vllm:prefix_cache_queries_total{engine="1",model_name="llama"} 34.0\n'
    )
    assert parse_engine_stats(VLLM_METRICS + counter).prefix_lookups == 1234.0


def test_an_older_vllms_names_are_read_where_the_current_ones_are_absent() -> None:
    """vLLM before about 0.10: read as absent, its figures would be an idle engine's."""
    older = (
        VLLM_METRICS.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        + "# TYPE vllm:gpu_prefix_cache_queries counter\n"
        + 'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="llama"} 1200.0\n'
    )
    stats = parse_engine_stats(older)
    assert (stats.kv_usage, stats.prefix_lookups) == (0.42, 1200.0)
    # The release that renamed them exports both: the current names are read, once.
    both = older + VLLM_METRICS + 'vllm:prefix_cache_queries_total{engine="0"} 1500.0\n'
    stats = parse_engine_stats(both.replace("} 0.42\n", "} 0.5\n", 1))
    assert (stats.kv_usage, stats.prefix_lookups) == (0.42, 1500.0)


@pytest.mark.parametrize("broken", ["NaN", "+Inf", "-Inf", "-3.0"])
def test_a_figure_that_is_not_a_finite_count_keeps_the_last_one(broken: str) -> None:
    last = EngineStats(running=2.0, waiting=5.0, kv_usage=0.3)
    for family, good in (("num_requests_waiting", "7.0"), ("kv_cache_usage_perc", "0.42")):
        # One bad sample among good ones (a second label set) spoils the figure too.
        line = f'vllm:{family}{{engine="0",model_name="llama"}} {good}'
        text = VLLM_METRICS.replace(line, f'{line}\nvllm:{family}{{engine="1"}} {broken}')
        stats = parse_engine_stats(text, last)
        if family == "num_requests_waiting":
            assert (stats.running, stats.waiting, stats.kv_usage) == (3.0, 5.0, 0.42)
        else:
            assert (stats.running, stats.waiting, stats.kv_usage) == (3.0, 7.0, 0.3)


def test_kv_capacity_sizes_the_prefix_index() -> None:
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    pool.apply_engine_stats(replica, parse_engine_stats(VLLM_METRICS))
    # 32,000 tokens x 4 chars per token (until usage teaches better) / 128-byte blocks, times
    # the caches' worth the index remembers
    assert pool.router.index_blocks("a:1") == int(1000 * pool.policy.prefix.index_memory)
    assert replica.load().engine_waiting == 7.0  # nothing in flight from us, 7 on the engine


def test_a_cpu_tier_sizes_the_index_by_what_it_holds_once_it_has_evicted() -> None:
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    events = replica.kv_events = EventStream("tcp://unused")
    hashes = list(range(4001))
    events.apply(0, payload(block_stored(hashes, None, list(range(4001 * 16)), 16, None)))
    events.apply(1, payload(block_stored(hashes, None, [], 16, None, "CPU")))
    events.apply(2, payload(block_removed(hashes[2000:])))  # the GPU cache keeps 2,000
    remembered = pool.policy.prefix.index_memory
    # Nothing evicted from the tier yet: it holds all it was written, however much that is.
    pool.apply_engine_stats(replica, parse_engine_stats(VLLM_METRICS))
    assert pool.router.index_blocks("a:1") == int(pool.policy.prefix.index_blocks * remembered)
    # Once it evicts, what it holds is its size: 4,000 blocks, 64,000 tokens, twice the GPU's.
    events.apply(3, payload(block_removed(hashes[:1], "CPU")))
    pool.apply_engine_stats(replica, parse_engine_stats(VLLM_METRICS))
    assert pool.router.index_blocks("a:1") == int(2000 * remembered)


def test_own_requests_that_left_the_engine_queue_since_the_scrape_are_not_counted_waiting() -> None:
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    text = b"a shared system prompt " * 200
    request = pool.router.features("m", lambda: CanonicalPrompt(text, lead_bytes=len(text)))
    dispatches = []
    for _ in range(3):
        decision = pool.decide(request)
        assert decision is not None
        dispatches.append(pool.begin(decision, request))
    pool.apply_engine_stats(replica, EngineStats(running=0, waiting=3))  # all three queued
    for dispatch in dispatches[:2]:
        pool.first_byte(dispatch, 0.05)
    load = replica.load()
    # One of ours still waits and the scrape saw nobody else's: no unknown prefill ahead.
    assert (load.engine_waiting, load.pending_requests) == (1.0, 1)
    assert queued_tokens(load, prompt_tokens=1000) == load.pending_prefill_tokens
    pool.apply_engine_stats(replica, EngineStats(running=2, waiting=3))  # a fresh scrape
    assert replica.load().engine_waiting == 3.0  # two of them someone else's, counted again


def test_a_usage_without_cached_tokens_is_a_miss_once_the_replica_has_reported_them() -> None:
    # vLLM (before it tested the count for None) leaves prompt_tokens_details out when 0.
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    text = b"a shared system prompt " * 200
    request = pool.router.features("m", lambda: CanonicalPrompt(text, lead_bytes=len(text)))

    def answered(usage: PromptUsage) -> None:
        decision = pool.decide(request)
        assert decision is not None
        dispatch = pool.begin(replace(decision, uncached_tokens=0.0), request)  # held, it says
        pool.learned.observe(dispatch, usage)
        pool.end(dispatch)

    answered(PromptUsage(1000, None))  # no details yet: nothing known of its cache
    assert replica.index_belief.value == 1.0
    answered(PromptUsage(1000, 1000))
    for _ in range(10):
        answered(PromptUsage(1000, None))  # the index promised 1000 tokens: none were there
    assert replica.index_belief.value < 0.5


def test_the_index_shrinks_when_the_replica_reports_fewer_hits_than_it_promised() -> None:
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica = pool.replicas["a:1"]
    for _ in range(30):
        replica.index_belief.observe(expected_cached=1000, cached=500)
    pool.apply_engine_stats(replica, parse_engine_stats(VLLM_METRICS))
    assert 500 <= pool.router.index_blocks("a:1") / pool.policy.prefix.index_memory <= 650


def test_health_needs_consecutive_evidence_after_the_first_probe() -> None:
    replica = ReplicaState.for_pool("http://a:1", PoolPolicy(model="m", replicas=["http://a:1"]))
    replica.record_probe(False, unhealthy_after=2, healthy_after=2)
    assert not replica.healthy  # the first probe is taken at its word
    replica.record_probe(True, 2, 2)
    assert not replica.healthy
    replica.record_probe(True, 2, 2)
    assert replica.healthy
    replica.record_probe(False, 2, 2)
    assert replica.healthy
    replica.record_probe(False, 2, 2)
    assert not replica.healthy
