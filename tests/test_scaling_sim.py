"""The autoscaling simulation (bench/scaling/): its HPA, its engine model, and what it shows."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from bench.scaling import (
    EngineModel,
    Hpa,
    HpaBehavior,
    ScalingConfig,
    ScalingResult,
    Summary,
    _Simulation,
    add_arguments,
    config_from_args,
    direction_changes,
    format_report,
    hpa_external_average_value,
    max_direction_changes,
    plot,
    poisson_arrivals,
    replica_steady_state,
    right_replicas,
    run_scaling,
    strategies,
)
from router_policies.schema import AutoscaleSettings

# -- the HPA's arithmetic ----------------------------------------------------------------------

# metric, averageValue target, current replicas, expected recommendation
HPA_CASES = [
    (10.0, 1.0, 10, 10),  # on target
    (10.9, 1.0, 10, 10),  # ratio 1.09: inside the 10% tolerance, keep
    (9.5, 1.0, 10, 10),  # ratio 0.95: inside, keep
    (11.5, 1.0, 10, 12),  # ratio 1.15: ceil(11.5 / 1)
    (8.0, 1.0, 10, 8),  # ratio 0.8: down to ceil(8 / 1)
    (64.0, 1.0, 2, 64),  # the count does not depend on the current one: ceil(metric / target)
    (27.0, 5.0, 2, 6),  # 27 waiting / 5 per replica: ceil(5.4)
    (21.0, 5.0, 4, 4),  # 21 / (5 x 4) = 1.05: keep
    (0.0, 5.0, 3, 0),  # nothing waiting: 0 (min replicas bound it later)
    (12.0, 4.0, 2, 3),  # queue depth 12 at 4 per replica: 3
    (3.0, 1.0, 3, 3),
]


@pytest.mark.parametrize(("metric", "target", "current", "expected"), HPA_CASES)
def test_external_average_value_formula_and_tolerance(
    metric: float, target: float, current: int, expected: int
) -> None:
    assert hpa_external_average_value(metric, target, current) == expected


def test_hpa_scale_up_is_limited_to_max_of_double_or_four_pods_per_period() -> None:
    hpa = Hpa(target=1, min_replicas=2, max_replicas=64)
    replicas, seen = 2, []
    for sync in range(6):
        replicas = hpa.sync(15.0 * sync, 64.0, replicas)
        seen.append(replicas)
    assert seen == [6, 12, 24, 48, 64, 64]  # +4, then +100% each 15 s, capped at max


def test_hpa_scale_down_waits_for_its_stabilization_window() -> None:
    hpa = Hpa(target=1, min_replicas=2, max_replicas=64)
    assert hpa.sync(0.0, 10.0, 10) == 10
    held = [hpa.sync(t, 3.0, 10) for t in range(15, 300, 15)]
    assert held == [10] * len(held)  # the recommendation of t=0 is inside the window
    # Upstream keeps recommendations strictly after now - window: at 300 s it has left.
    assert hpa.sync(300.0, 3.0, 10) == 3
    assert hpa.sync(315.0, 1.0, 3) == 3  # the recommendations of 3 are the window's highest
    assert hpa.sync(615.0, 1.0, 3) == 2  # ...until they leave it; then min replicas


def test_hpa_without_stabilization_follows_at_once() -> None:
    hpa = Hpa(target=1, min_replicas=1, max_replicas=10, behavior=HpaBehavior(0.0, (), 0.0))
    assert hpa.sync(0.0, 8.0, 8) == 8
    assert hpa.sync(15.0, 2.0, 8) == 2


def test_direction_changes_are_counted_per_window() -> None:
    times = [0.0, 15.0, 30.0, 45.0, 60.0, 400.0, 415.0]
    values = [2, 6, 6, 3, 6, 6, 2]
    assert direction_changes(times, values) == [45.0, 60.0, 415.0]
    assert max_direction_changes(times, values, 300.0) == 2
    assert max_direction_changes(times, values, 10.0) == 1
    assert max_direction_changes([0.0, 15.0], [2, 2], 300.0) == 0


# -- the engine model and the right value ------------------------------------------------------


def test_right_value_comes_from_the_engine_model() -> None:
    model, settings = EngineModel(), AutoscaleSettings(min_replicas=1)
    capacity = model.max_rate(settings.kv_usage_ceiling)
    assert 9.0 < capacity < 9.2  # 256 slots bind before the 0.9 KV ceiling here
    assert model.kv_usage_at(capacity) < settings.kv_usage_ceiling
    assert right_replicas(12.0, model, settings) == 2
    assert right_replicas(48.0, model, settings) == 6
    assert right_replicas(10_000.0, model, settings) == settings.max_replicas


def test_simulated_replica_matches_the_fluid_model() -> None:
    model = EngineModel()
    capacity = model.max_rate(0.9)
    # At 48 req/s over 6 replicas (88% of capacity) nothing queues...
    throughput, waiting, _ = replica_steady_state(model, 48.0 / 6, seconds=300.0)
    assert waiting < 1.0
    assert throughput == pytest.approx(8.0, rel=0.05)
    # ...and overloaded, the replica completes what the model says it can.
    throughput, waiting, running = replica_steady_state(model, 1.3 * capacity, seconds=300.0)
    assert throughput == pytest.approx(capacity, rel=0.03)
    assert running == pytest.approx(model.max_num_seqs, rel=0.01)
    assert waiting > 100


# -- the simulation ----------------------------------------------------------------------------

SHORT = replace(ScalingConfig(), step_duration_s=300.0, scenarios=("step",), strategies=("A",))


@pytest.fixture(scope="module")
def step_run() -> ScalingResult:
    """The default step (12 -> 48 req/s at 60 s), long enough for a full scale-down cycle."""
    return run_scaling(replace(ScalingConfig(), scenarios=("step",), strategies=("A", "B", "P")))


def test_p_is_the_gateway_code_with_a_target_rate() -> None:
    """P is no copy of the formula: the simulated gateway's own PoolState, configured with
    target_rate_per_replica, counts every arrival and measures their rate with its RateMeter."""
    config = replace(SHORT, strategies=("P",))
    capacity = config.engine.max_rate(config.settings.kv_usage_ceiling)
    assert config.settings_for("A").target_rate_per_replica is None
    assert config.settings_for("A") == config.settings
    p = config.settings_for("P")
    assert p.target_rate_per_replica == pytest.approx(0.8 * capacity)
    assert (p.backlog_drain_s, p.rate_window_s) == (config.backlog_drain_s, config.rate_window_s)
    assert p.min_replicas == config.settings.min_replicas
    scenario = config.scenario("step")
    arrivals = poisson_arrivals(scenario, config.seed, config.tick_s)
    sim = _Simulation(config, scenario, strategies(config)["P"], arrivals)
    primed = sim.pool.counts.arrivals  # the base load over one rate window before t=0
    assert primed == round(scenario.base_rate * config.rate_window_s)
    sim.run()
    assert sim.pool.policy.autoscale == p
    end = scenario.duration_s - config.tick_s
    assert sim.pool.counts.arrivals == primed + sum(1 for a in arrivals if a < end)
    assert sim.pool.autoscale.arrival_rate == pytest.approx(
        scenario.base_rate * scenario.factor, rel=0.2
    )


def summary(result: ScalingResult, key: str) -> Summary:
    return next(o.summary for o in result.scenarios[0].outcomes if o.strategy.key == key)


def test_a_step_makes_the_gateway_strategy_scale_up(step_run: ScalingResult) -> None:
    run = next(o for o in step_run.scenarios[0].outcomes if o.strategy.key == "A")
    s = run.series
    before = {r for t, r in zip(s.t, s.ready, strict=True) if t < 60}
    assert before == {2}
    assert run.summary.ready_at_s is not None
    # The first HPA sync after the first scrape after the step (t=82.5) adds pods that serve
    # a cold start (90 s) later.
    assert run.summary.ready_at_s == pytest.approx(82.5 + 90 - 60, abs=1.0)
    # The HPA sync at 67.5 s still reads the scrape of t=60, taken before the step.
    after = [v for t, v in zip(s.hpa_t, s.hpa_value, strict=True) if 60 < t < 160]
    # On the capacity estimated from the learned rates (an estimate that runs low while the
    # rates settle): up to one replica above the base load's 2, then the rate term's count.
    assert after[0] <= 3
    assert after[1] >= run.summary.right_after
    assert max(after) <= 2 * run.summary.right_after
    assert after[-1] >= run.summary.right_after


def test_the_gateway_stabilizer_holds_the_signal_after_the_queue_drains(
    step_run: ScalingResult,
) -> None:
    s = next(o for o in step_run.scenarios[0].outcomes if o.strategy.key == "A").series
    drained = next(t for t, q in zip(s.t, s.queue_depth, strict=True) if t > 120 and q == 0)
    scrapes = list(zip(s.scrape_t, s.scrape_signal, strict=True))
    held = next(v for t, v in reversed(scrapes) if t <= drained)
    peaked = min(t for t, v in scrapes if t > 120 and v == held)
    dropped = next(t for t, v in scrapes if t > drained and v < held)
    assert dropped - peaked >= 300 - 15  # ScaleDownStabilizer's window, seen at a scrape


def test_hpa_scale_down_window_is_zero_on_the_gateway_signal_only(
    step_run: ScalingResult,
) -> None:
    config = ScalingConfig()
    assert config.hpa_scale_down_window_s == 0.0
    assert config.queue_hpa_scale_down_window_s == 300.0
    table = strategies(config)
    assert [k for k in ("A", "B", "C", "P") if table[k].stabilized] == ["A", "P"]
    # B's signal (the engines' waiting queue) drops the moment the backlog is gone; the HPA
    # keeps its default 300 s window before it removes a pod.
    s = next(o for o in step_run.scenarios[0].outcomes if o.strategy.key == "B").series
    drained = next(t for t, q in zip(s.t, s.queue_depth, strict=True) if t > 120 and q == 0)
    quiet = next(t for t, v in zip(s.scrape_t, s.scrape_signal, strict=True) if t >= drained)
    removed = next(t for t, v in zip(s.hpa_t, s.hpa_value, strict=True) if t > drained and v < 64)
    assert removed - quiet >= 300 - 15


def test_simulation_is_deterministic_for_a_seed() -> None:
    first, again = run_scaling(SHORT), run_scaling(SHORT)
    other = run_scaling(replace(SHORT, seed=2))
    a, b, c = (r.scenarios[0] for r in (first, again, other))
    assert a.arrivals == b.arrivals
    assert a.outcomes[0].series == b.outcomes[0].series
    assert a.outcomes[0].summary == b.outcomes[0].summary
    assert a.arrivals != c.arrivals


def test_engine_only_signal_misses_requests_held_in_the_gateway() -> None:
    # With the gateway holding requests at max_num_seqs per replica, the engines never queue:
    # the vLLM-stack signal sees nothing while the gateway's own signal scales up.
    config = replace(SHORT, inflight_limit=EngineModel().max_num_seqs, strategies=("A", "B"))
    result = run_scaling(config)
    assert summary(result, "B").peak_target == config.settings.min_replicas
    assert summary(result, "B").reach_intervals is None
    reach = summary(result, "A").reach_intervals
    assert reach is not None and reach <= 2


# -- the acceptance criterion, measured --------------------------------------------------------


def test_defaults_estimate_the_capacity_before_saturation_and_never_wind_up(
    step_run: ScalingResult,
) -> None:
    """With the schema defaults the gateway estimates a replica's capacity from the rates it
    learns at the base load (router_policies/capacity.py): the rate term runs from the first
    second, so the step never meets a blind queue term (which jumped to 51-64)."""
    a = summary(step_run, "A")
    assert a.right_after == 6
    assert a.peak_signal <= 2 * a.right_after
    assert a.peak_target < ScalingConfig().settings.max_replicas


def test_current_formula_meets_the_acceptance(step_run: ScalingResult) -> None:
    """The default settings (no target_rate_per_replica): the right count within 2 scrape
    intervals, at most one direction change of the HPA target per stabilization window."""
    a = summary(step_run, "A")
    assert a.reach_intervals is not None and a.reach_intervals <= 2
    assert a.max_changes_per_window <= 1
    assert a.acceptance


def test_gateway_with_target_rate_meets_the_acceptance(step_run: ScalingResult) -> None:
    """The gateway's formula with target_rate_per_replica = 0.8 x capacity, backlog_drain_s
    120 and rate_window_s 15, under an HPA with no scale-down window of its own."""
    p = summary(step_run, "P")
    assert p.acceptance
    assert p.reach_intervals is not None and p.reach_intervals <= 1
    assert p.max_changes_per_window <= 1
    assert p.peak_target <= 2 * p.right_after
    assert p.replica_s <= summary(step_run, "A").replica_s
    s = next(o for o in step_run.scenarios[0].outcomes if o.strategy.key == "P").series
    assert s.hpa_value[-1] >= p.right_after  # settles above the right value, not at the floor


def test_default_rate_window_reaches_a_scrape_interval_late() -> None:
    """With the schema's rate_window_s of 60 s the rate term lags the step: the signal is at
    the right value only after 3 scrape intervals. What docs/scaling.md says to configure."""
    config = replace(ScalingConfig(), rate_window_s=60.0, scenarios=("step",), strategies=("P",))
    p = run_scaling(config).scenarios[0].outcomes[0].summary
    assert p.reach_intervals == 3
    assert p.max_changes_per_window <= 1
    assert not p.acceptance


# -- report, plots, command line ---------------------------------------------------------------


def test_report_and_plot(tmp_path: Path) -> None:
    result = run_scaling(replace(SHORT, strategies=("A", "P")))
    report = format_report(result)
    assert "== step" in report and "acceptance" in report
    path = tmp_path / "scaling-step.png"
    plot(result.scenarios[0], path, result.config)
    assert path.stat().st_size > 10_000


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_arguments_build_the_configuration() -> None:
    config = config_from_args(parse("--cold-start-s", "60", "--seed", "3", "--base-rate", "20"))
    assert (config.cold_start_s, config.seed, config.base_rate) == (60.0, 3, 20.0)
    assert config.settings.min_replicas == 3  # the right value at the base load
    assert config.strategies == ("A", "B", "C", "P")
    assert (config.target_utilization, config.backlog_drain_s, config.rate_window_s) == (
        0.8,
        120.0,
        15.0,
    )
    assert (config.hpa_scale_down_window_s, config.queue_hpa_scale_down_window_s) == (0.0, 300.0)
    config = config_from_args(
        parse("--target-utilization", "0.9", "--rate-window-s", "60", "--backlog-drain-s", "300")
    )
    assert config.settings_for("P").rate_window_s == 60.0
    assert config.settings_for("P").backlog_drain_s == 300.0
    assert config.target_utilization == 0.9
    with pytest.raises(ValueError, match="strategies"):
        config_from_args(parse("--strategies", "A,R"))
    with pytest.raises(ValueError, match="cold-start"):
        config_from_args(parse("--cold-start-s", "-1"))
    with pytest.raises(ValueError, match="target-utilization"):
        config_from_args(parse("--target-utilization", "1.5"))
    with pytest.raises(ValueError, match="rate-window"):
        config_from_args(parse("--rate-window-s", "0"))
