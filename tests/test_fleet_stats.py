"""Prefix-cache hit rates read from replicas' own vllm: counters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from bench import fleet_stats
from bench.fleet_stats import (
    CacheCounters,
    delta,
    fleet_counters,
    fleet_hit_rate,
    parse_cache_counters,
    reset_prefix_caches,
)
from replica.sim.config import SimConfig
from replica.sim.engine import Engine
from replica.sim.metrics import SimMetrics
from tests.conftest import fake_replica

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 12000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries created.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="llama"} 1.7e9
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 9000.0
# HELP vllm:gpu_prefix_cache_hits_total Deprecated twin that must not be counted.
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="llama"} 5.0
"""


def test_parses_vllm_counters_and_ignores_other_series() -> None:
    assert parse_cache_counters(VLLM_TEXT) == CacheCounters(queries=12000.0, hits=9000.0)
    assert parse_cache_counters(VLLM_TEXT).hit_rate == pytest.approx(0.75)


def test_sums_over_label_sets() -> None:
    text = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="base"} 100.0
vllm:prefix_cache_queries_total{model_name="lora-a"} 50.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="base"} 40.0
vllm:prefix_cache_hits_total{model_name="lora-a"} 20.0
"""
    assert parse_cache_counters(text) == CacheCounters(queries=150.0, hits=60.0)


def test_tokens_a_cpu_tier_loaded_back_are_hits_of_the_query() -> None:
    # vLLM's own reading: vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.
    text = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 100.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 40.0
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{model_name="m"} 60.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{model_name="m"} 32.0
"""
    assert parse_cache_counters(text) == CacheCounters(queries=100.0, hits=72.0)


def test_missing_series_mean_no_rate_rather_than_zero() -> None:
    counters = parse_cache_counters("# TYPE up gauge\nup 1.0\n")
    assert counters == CacheCounters(0.0, 0.0)
    assert counters.hit_rate is None


def test_reads_the_simulated_replicas_own_exposition() -> None:
    engine = Engine(SimConfig.model_validate({}))
    engine.stats.prefix_cache_queries = 640
    engine.stats.prefix_cache_hits = 512
    text = SimMetrics(engine).render().decode()
    assert parse_cache_counters(text) == CacheCounters(queries=640.0, hits=512.0)


def test_delta_is_per_replica_between_snapshots() -> None:
    before = {"a": CacheCounters(100, 50), "b": CacheCounters(10, 0)}
    after = {"a": CacheCounters(300, 200), "b": CacheCounters(10, 0)}
    assert delta(before, after) == {"a": CacheCounters(200, 150), "b": CacheCounters(0, 0)}


def test_delta_counts_everything_after_a_restart_or_for_a_new_replica() -> None:
    before = {"a": CacheCounters(1000, 900)}
    after = {"a": CacheCounters(40, 10), "b": CacheCounters(7, 3)}
    assert delta(before, after) == {"a": CacheCounters(40, 10), "b": CacheCounters(7, 3)}


def test_fleet_rate_weighs_replicas_by_their_queries() -> None:
    # A busy replica at 90% and an almost idle one at 0%: the fleet is near 90%, not at 45%.
    counters = {"busy": CacheCounters(1000, 900), "idle": CacheCounters(10, 0)}
    assert fleet_counters(counters) == CacheCounters(1010, 900)
    assert fleet_hit_rate(counters) == pytest.approx(900 / 1010)


def test_fleet_with_no_queries_has_no_rate() -> None:
    assert fleet_hit_rate({}) is None
    assert fleet_hit_rate({"a": CacheCounters()}) is None


def refusing(times: int) -> tuple[list[int], Callable[[web.Request], Awaitable[web.Response]]]:
    """A replica's /reset_prefix_cache that answers vLLM's refusal ``times`` times, then
    resets; and the list its calls are counted in."""
    calls: list[int] = []

    async def reset(request: web.Request) -> web.Response:
        calls.append(1)
        return web.json_response({"success": len(calls) > times})

    return calls, reset


async def test_a_refused_reset_is_tried_again_until_the_replica_resets() -> None:
    calls, reset = refusing(2)
    async with fake_replica(reset, "/reset_prefix_cache") as url:
        await reset_prefix_caches([url])
    assert len(calls) == 3


async def test_a_replica_that_keeps_refusing_to_reset_stops_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured on a cache left warm, a target would count hits no routing earned."""
    monkeypatch.setattr(fleet_stats, "RESET_TRIES", 2)
    _, reset = refusing(5)
    async with fake_replica(reset, "/reset_prefix_cache") as url:
        with pytest.raises(RuntimeError, match="refused to reset"):
            await reset_prefix_caches([url])
