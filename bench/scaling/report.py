"""The text report of a scaling run."""

from __future__ import annotations

import math

from bench.scaling.config import Scenario, strategies
from bench.scaling.model import right_replicas
from bench.scaling.results import ScalingResult


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "never"
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def describe(scenario: Scenario) -> str:
    low, high = scenario.base_rate, scenario.base_rate * scenario.factor
    if scenario.name == "step":
        return f"{low:g} -> {high:g} req/s at t={scenario.event_s:g} s"
    return (
        f"{low:g} -> {high:g} req/s linearly over {scenario.rise_s:g} s from "
        f"t={scenario.event_s:g} s, back over {scenario.rise_s:g} s"
    )


def format_report(result: ScalingResult) -> str:
    c = result.config
    m, s = c.engine, c.settings
    table = strategies(c)
    cap = m.max_rate(s.kv_usage_ceiling)
    lines = [
        "Autoscaling simulation (bench/scaling/)",
        "",
        f"engine   max_num_seqs {m.max_num_seqs}, KV {m.kv_capacity_tokens:,} tokens, "
        f"{m.prompt_tokens} prompt + {m.output_tokens} output tokens per request, decode step "
        f"{m.decode_step_s * 1e3:g} ms + {m.decode_s_per_seq * 1e3:g} ms/seq, prefill "
        f"{m.prefill_s_per_token * 1e6:g} us/token",
        f"         capacity {cap:.2f} req/s per replica with no standing queue and KV <= "
        f"{s.kv_usage_ceiling:g} (running {min(m.running_at(cap), m.admit_limit):.0f}, KV "
        f"{m.kv_usage_at(cap):.2f} there); at 60% of it: running "
        f"{m.running_at(0.6 * cap):.0f}, KV {m.kv_usage_at(0.6 * cap):.2f}",
        f"gateway  target_queue_per_replica {s.target_queue_per_replica:g}, kv_usage_ceiling "
        f"{s.kv_usage_ceiling:g}, replicas {s.min_replicas}-{s.max_replicas}, stabilization "
        f"{s.scale_down_stabilization_s:g} s, update_desired every {c.gateway_round_s:g} s, "
        f"in-flight limit {c.inflight_limit or 'none'}",
        f"         A: target_rate_per_replica unset ({s.target_utilization:g} x the capacity "
        f"estimated from the learned rates, measured once saturated); P: target_rate_per_replica "
        f"{c.target_rate_per_replica:.2f} req/s ({c.target_utilization:g} x capacity), "
        f"backlog_drain_s {c.backlog_drain_s:g}, rate_window_s {c.rate_window_s:g}",
        f"cluster  cold start {c.cold_start_s:g} s, scrape every {c.scrape_interval_s:g} s, HPA "
        f"sync every {c.hpa_sync_s:g} s ({c.hpa_phase_s:g} s after a scrape), tolerance 0.1, "
        "default rate limits (up: max(+100%, +4 pods) per 15 s; down: 100% per 15 s), "
        f"min/max as the gateway's, seed {c.seed}",
        f"         scale-down stabilization window {c.hpa_scale_down_window_s:g} s on the "
        f"gateway's desired count (A, P), {c.queue_hpa_scale_down_window_s:g} s on queues (B, C)",
        "",
    ]
    for key in c.strategies:
        strategy = table[key]
        lines.append(
            f"{key}  {strategy.label}: HPA on {strategy.metric}, averageValue {strategy.target:g}"
        )
    header = (
        "  strategy                              reach  sig@2   lag  peak sig/tgt  chg/300s"
        "  total  ready@  short  TTFT p50/p90 s   pod-h  open@end"
    )
    for outcome in result.scenarios:
        sc = outcome.scenario
        first = outcome.outcomes[0].summary
        lines += [
            "",
            f"== {sc.name}: {describe(sc)}, {sc.duration_s:g} s, {outcome.arrivals} requests; "
            f"right value {right_replicas(sc.base_rate, m, s)} -> {first.right_after} replicas "
            f"(ideal {first.ideal_replica_s / 3600:.2f} pod-h)",
            "",
            header,
        ]
        for run in outcome.outcomes:
            x = run.summary
            ttft = f"{_fmt(x.ttft_p50_s, 2)}/{_fmt(x.ttft_p90_s, 1)}"
            lines.append(
                f"  {run.strategy.key} {run.strategy.label:<35} {_fmt(x.reach_intervals):>5}  "
                f"{_fmt(x.signal_at_2, 0):>5}  {_fmt(x.lag_intervals):>4}  "
                f"{_fmt(x.peak_signal, 0):>4}/{x.peak_target:<4}  {x.max_changes_per_window:>8}  "
                f"{x.total_changes:>5}  {_fmt(x.ready_at_s, 0):>6}  {x.short_s:>5.0f}  "
                f"{ttft:>14}  {x.replica_s / 3600:>6.2f}  {x.unserved:>8}"
            )
    lines += [
        "",
        "reach: scrape intervals from the step until the scraped signal (B, C: the replicas",
        "  the HPA derives, ceil(metric / averageValue)) is first at least the right value;",
        "  sig@2: that signal two intervals after the step; lag: worst scrape intervals from a",
        "  rise of the right value until the HPA target reaches it; chg/300s: most direction",
        "  changes of the HPA target in any stabilization window; ready@: seconds from the event",
        "  until the right value of replicas serve; short: seconds with fewer; TTFT: requests",
        "  arriving in the 300 s after the step (ramp: during the rise and fall); pod-h: pod",
        "  hours including cold starts and draining; open@end: requests with no first token when",
        "  the run ends.",
        "",
        "acceptance (step): the signal reaches the right value within 2 scrape intervals and",
        "the HPA target changes direction at most once per stabilization window",
    ]
    for outcome in result.scenarios:
        if outcome.scenario.name != "step":
            continue
        for run in outcome.outcomes:
            x = run.summary
            verdict = "PASS" if x.acceptance else "FAIL"
            over = x.peak_signal / x.right_after
            lines.append(
                f"  {run.strategy.key} {verdict}: reach {_fmt(x.reach_intervals)} intervals "
                f"(signal peaks at {x.peak_signal:g} = {over:.1f} x right value), "
                f"{x.max_changes_per_window} direction change(s) in a window, "
                f"{x.total_changes} in all"
            )
    return "\n".join(lines) + "\n"
