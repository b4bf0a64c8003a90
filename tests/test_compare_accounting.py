"""``bench compare``'s accounting, on hand-made figures: the affinity bound (the share of prompt
tokens any routing could serve from cache, counting only full blocks an earlier prompt computed),
per-replica requests and cache hits as counter deltas read from one exposition (surviving a
replica's restart), and the summary of a run (hits, balance, ITL, throughput, per-route figures).
"""

from __future__ import annotations

import pytest

from bench.affinity import AffinityBound, affinity_bound
from bench.compare.markdown import route_text
from bench.compare.results import PREFIX_AWARE, summarize
from bench.driver import RequestResult, RunResult
from bench.fleet_stats import CacheCounters
from bench.replica_counters import ReplicaCounters, delta, max_over_mean, parse_replica_counters
from bench.workloads import generated_shared_prefix
from replica.sim.tokenizer import render_chat

# --- the affinity bound -------------------------------------------------------------------


def _chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_bound_counts_only_full_blocks_seen_in_an_earlier_prompt() -> None:
    # "<|system|>\n" is 11 characters: a 117-character system prompt makes the rendered
    # system part exactly 128 characters = 32 tokens = 2 blocks of 16 (4 characters a token).
    system = "s" * 117
    first, second = _chat(system, "a" * 200), _chat(system, "b" * 200)
    tokens = len(render_chat(first)) // 4 + (len(render_chat(first)) % 4 > 0)
    bound = affinity_bound([first, second])
    assert bound == AffinityBound(prompt_tokens=2 * tokens, reusable_tokens=32)
    assert bound.bound == pytest.approx(32 / (2 * tokens))


def test_bound_of_a_repeated_prompt_stops_before_its_last_token() -> None:
    # 64 tokens exactly: 4 full blocks, but vLLM recomputes the last token, so 3 can hit.
    prompt = [
        {
            "role": "user",
            "content": "x" * (256 - len(render_chat([{"role": "user", "content": ""}]))),
        }
    ]
    assert len(render_chat(prompt)) == 256
    assert affinity_bound([prompt, prompt]) == AffinityBound(128, 48)


def test_bound_is_zero_for_disjoint_prompts_and_no_prompts() -> None:
    assert affinity_bound([]).bound == 0.0
    disjoint = affinity_bound([_chat("a" * 400, "q"), _chat("b" * 400, "q")])
    assert disjoint.reusable_tokens == 0


def test_bound_of_a_workload_matches_its_shape() -> None:
    """Generated shared prefix: all but each group's first prompt reuse the system prompt."""
    workload = generated_shared_prefix(4, 5, 256, 32, 4, seed=1)
    bound = affinity_bound(c.request(0, []).messages for c in workload)
    # 16 of 20 prompts reuse ~the system prompt's 256+ tokens of ~292.
    assert 0.65 < bound.bound < 16 / 20


# --- per-replica accounting from counters --------------------------------------------------

SIM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 600.0
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{finished_reason="length",model_name="m"} 7.0
# TYPE vllm:request_success_created gauge
vllm:request_success_created{finished_reason="stop",model_name="m"} 1.7e9
"""


def test_parses_requests_cache_and_queue_from_one_exposition() -> None:
    counters = parse_replica_counters(SIM_METRICS)
    assert counters == ReplicaCounters(10.0, CacheCounters(1000.0, 600.0), 2.0, 1.0)
    assert not counters.idle


def test_per_replica_requests_are_counter_deltas() -> None:
    before = {
        "a": ReplicaCounters(10, CacheCounters(1000, 600)),
        "b": ReplicaCounters(5, CacheCounters(500, 100)),
    }
    after = {
        "a": ReplicaCounters(25, CacheCounters(4000, 3000)),
        # b restarted: its counters went back, and all it counted since is new.
        "b": ReplicaCounters(4, CacheCounters(300, 0)),
        # c is new: it counts all.
        "c": ReplicaCounters(6, CacheCounters(600, 60)),
    }
    moved = delta(before, after)
    assert [moved[k].requests for k in "abc"] == [15, 4, 6]
    assert moved["a"].cache == CacheCounters(3000, 2400)
    assert moved["b"].cache == CacheCounters(300, 0)
    assert max_over_mean([15, 4, 6, 3]) == pytest.approx(15 / 7)
    assert max_over_mean([5, 5]) == 1.0
    assert max_over_mean([0, 0]) is None
    assert max_over_mean([]) is None


def _result(
    ttft: float, latency: float, tokens: int, route: str, prompt: int = 0, cached: int = 0
) -> RequestResult:
    return RequestResult(
        200, latency, ttft, output_tokens=tokens, prompt_tokens=prompt, cached_tokens=cached,
        route=route,
    )  # fmt: skip


def test_summarize_takes_hits_and_requests_from_the_replicas() -> None:
    run = RunResult(
        (
            _result(0.1, 0.5, 5, route="prefix-hit", prompt=1000, cached=900),
            _result(0.2, 1.0, 9, route="prefix-hit", prompt=1000, cached=700),
            _result(0.3, 0.3, 1, route="prefix-home", prompt=2000, cached=0),
            RequestResult(503, 0.01, error="overloaded"),
        ),
        wall_s=2.0,
        planned=5,
    )
    counters = {
        "http://b": ReplicaCounters(1, CacheCounters(1000, 100)),
        "http://a": ReplicaCounters(2, CacheCounters(3000, 2900)),
    }
    m = summarize(
        PREFIX_AWARE, "w", run, counters, ["http://a", "http://b"], AffinityBound(4000, 3200)
    )
    assert (m.planned, m.sent, m.ok, m.errors, m.not_sent) == (5, 4, 3, 1, 1)
    assert m.first_error == "overloaded"
    assert m.requests_per_replica == (2, 1)
    assert m.prefilled_per_replica == (100, 900)  # queries less hits: the new text stored
    assert m.balance == pytest.approx(2 / 1.5)
    assert m.hit_rate == pytest.approx(3000 / 4000)
    assert m.hit_fraction_of_bound == pytest.approx(0.75 / 0.8)
    # ITL: (latency - TTFT) / (tokens - 1); a one-token answer has none.
    assert sorted(m.itls) == pytest.approx([0.1, 0.1])
    assert m.output_tokens == 15 and m.output_tokens_per_s == pytest.approx(7.5)
    assert m.ttft(50) == pytest.approx(0.2)
    # Per route: its requests, the share of their prompts served from cache, their TTFTs.
    hit, home = m.routes
    assert (hit.route, hit.requests, hit.hit_rate) == ("prefix-hit", 2, 0.8)
    assert hit.ttft(50) == pytest.approx(0.15)
    assert (home.route, home.requests, home.hit_rate, home.ttfts) == ("prefix-home", 1, 0, (0.3,))
    assert route_text(hit) == "prefix-hit 2 (hit 80.0%, 150 / 199 ms)"
