"""``llm-gateway bench scaling``: how fast and how steadily an HPA follows the autoscaling signal.

A deterministic discrete-time simulation (0.1 s ticks, no processes, no sockets) of one pool of
vLLM replicas behind the gateway, scaled by a simulated Kubernetes HorizontalPodAutoscaler:

* Replicas are continuous-batching engines: at most ``max_num_seqs`` requests run at once and
  each reserves prompt + output tokens of KV cache at admission (like ``replica/sim``); the rest
  wait in the engine's own queue (``vllm:num_requests_waiting``). Prefill costs
  ``prefill_s_per_token`` per prompt token and every decode step ``decode_step_s +
  decode_s_per_seq x batch``, the timing model of the project's simulated replica.
* The gateway dispatches to the healthy replica with the fewest requests in flight and, with
  ``--inflight-limit``, holds requests itself when every replica is at the limit. Once a second
  it scrapes the engines and calls the real ``PoolState.update_desired`` (so
  ``router_policies.autoscale.desired_replicas``, ``RateMeter`` and ``ScaleDownStabilizer``),
  and it counts every request routed to the pool in ``PoolState.counts``, as it does live.
* Prometheus scrapes the gateway and the engines every ``--scrape-interval-s``; the HPA syncs
  every ``--hpa-sync-s`` on the latest scraped sample, with the ``autoscaling/v2`` rules for an
  External metric with an ``AverageValue`` target (10% tolerance, default rate limits). On the
  gateway's desired count, which the gateway already stabilizes, its scale-down window is 0 s;
  on the engine or gateway queues, the default 300 s.
* New replicas serve only after ``--cold-start-s`` (image pull and weight load); removed ones
  stop taking requests at once and finish what they hold.

Strategies, run on the same Poisson arrivals: A, the HPA on ``gateway_pool_desired_replicas``
(averageValue 1) with the default settings (queue term); P, on the same metric with
``target_rate_per_replica`` configured (rate term: arrival rate + backlog / backlog_drain_s);
B, on the engines' waiting queues, like vLLM's production stack
(``sum(vllm:num_requests_waiting)``, averageValue 5); C, on ``gateway_pool_queue_depth``
(averageValue = target_queue_per_replica). A and P differ only in their AutoscaleSettings: both
are the gateway's own code. See docs/scaling.md.
"""

# Modules: ``model`` (the engine), ``hpa`` (the controller), ``config`` (scenarios, settings,
# strategies), ``pods`` and ``simulation`` (the loop), ``results``, ``report``, ``plots``, ``cli``.

from __future__ import annotations

from bench.scaling.cli import add_arguments, config_from_args, run
from bench.scaling.config import (
    STRATEGY_KEYS,
    ScalingConfig,
    Scenario,
    Strategy,
    baseline_settings,
    strategies,
)
from bench.scaling.hpa import Hpa, HpaBehavior, ScalingPolicy, hpa_external_average_value
from bench.scaling.model import EngineModel, right_replicas
from bench.scaling.plots import plot
from bench.scaling.pods import poisson_arrivals, replica_steady_state
from bench.scaling.report import format_report
from bench.scaling.results import (
    ScalingResult,
    ScenarioOutcome,
    Series,
    StrategyOutcome,
    Summary,
    direction_changes,
    max_direction_changes,
)
from bench.scaling.simulation import _Simulation, run_scaling

__all__ = [
    "STRATEGY_KEYS",
    "EngineModel",
    "Hpa",
    "HpaBehavior",
    "ScalingConfig",
    "ScalingPolicy",
    "ScalingResult",
    "Scenario",
    "ScenarioOutcome",
    "Series",
    "Strategy",
    "StrategyOutcome",
    "Summary",
    "_Simulation",
    "add_arguments",
    "baseline_settings",
    "config_from_args",
    "direction_changes",
    "format_report",
    "hpa_external_average_value",
    "max_direction_changes",
    "plot",
    "poisson_arrivals",
    "replica_steady_state",
    "right_replicas",
    "run",
    "run_scaling",
    "strategies",
]
