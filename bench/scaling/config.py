"""What a run simulates: the load scenarios, the cluster and gateway settings, and the
strategies (which metric the HPA scales on)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.scaling.model import EngineModel, right_replicas
from replica.vllm_metrics import NUM_WAITING
from router_policies.schema import AutoscaleSettings


@dataclass(frozen=True, slots=True)
class Scenario:
    """Arrival rate over time: ``step`` (x factor at event_s, held) or ``ramp`` (linear rise to
    x factor over rise_s from event_s, linear fall over as long, then base again)."""

    name: str
    base_rate: float
    factor: float
    event_s: float
    duration_s: float
    rise_s: float = 0.0

    def rate(self, t: float) -> float:
        high = self.base_rate * self.factor
        if t < self.event_s:
            return self.base_rate
        if self.name == "step":
            return high
        into = t - self.event_s
        if into < self.rise_s:
            return self.base_rate + (high - self.base_rate) * into / self.rise_s
        if into < 2 * self.rise_s:
            return high - (high - self.base_rate) * (into - self.rise_s) / self.rise_s
        return self.base_rate


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    seed: int = 1
    cold_start_s: float = 90.0
    """Pod created -> serving: image pull (cached node: seconds; cold: minutes) plus loading
    16 GB of weights and CUDA-graph capture; 60-120 s is typical for an 8B model."""
    scrape_interval_s: float = 15.0
    """Prometheus scrape interval of the gateway and the engines."""
    hpa_sync_s: float = 15.0
    """kube-controller-manager --horizontal-pod-autoscaler-sync-period."""
    hpa_scale_down_window_s: float = 0.0
    """behavior.scaleDown.stabilizationWindowSeconds of the HPA on the gateway's desired count
    (A, P): 0, since the gateway already holds it for scale_down_stabilization_s (300 s); the
    HPA's own default would add another 300 s. The Helm chart sets the same."""
    queue_hpa_scale_down_window_s: float = 300.0
    """The same for the HPA on a queue (B, C), which nothing else stabilizes: the default 300."""
    hpa_phase_s: float = 7.5
    """HPA syncs this long after each scrape (they are not aligned; half an interval)."""
    gateway_round_s: float = 1.0
    """Gateway scrape + update_desired cadence (GATEWAY_SCRAPE_INTERVAL_S default)."""
    tick_s: float = 0.1
    base_rate: float = 12.0
    factor: float = 4.0
    event_s: float = 60.0
    step_duration_s: float = 1200.0
    ramp_rise_s: float = 300.0
    ramp_duration_s: float = 1260.0
    inflight_limit: int | None = None
    """PoolPolicy.max_inflight_per_replica: beyond it requests wait in the gateway."""
    engine: EngineModel = field(default_factory=EngineModel)
    settings: AutoscaleSettings = field(default_factory=lambda: AutoscaleSettings(min_replicas=2))
    """The gateway's autoscale settings: schema defaults (no
    target_rate_per_replica, so the capacity learned or estimated) but min_replicas, also every
    strategy's HPA floor: the right value at the base
    load (``baseline_settings``), 2 for the default 12 req/s. A, B and C run these."""
    target_utilization: float = 0.8
    """P: target_rate_per_replica as a share of the measured per-replica capacity (the model's
    max_rate); the headroom covers the load that arrives during a cold start."""
    backlog_drain_s: float = AutoscaleSettings().backlog_drain_s
    """P: the gateway's backlog_drain_s (the schema default, 120 s)."""
    rate_window_s: float = 15.0
    """P: the gateway's rate_window_s (15 s, the schema default): with 60 s the signal
    reaches the right value a scrape interval late (docs/scaling.md)."""
    strategies: tuple[str, ...] = ("A", "B", "C", "P")
    scenarios: tuple[str, ...] = ("step", "ramp")
    ttft_window_s: float = 30.0

    def scenario(self, name: str) -> Scenario:
        if name == "step":
            return Scenario("step", self.base_rate, self.factor, self.event_s, self.step_duration_s)
        return Scenario(
            "ramp",
            self.base_rate,
            self.factor,
            self.event_s,
            self.ramp_duration_s,
            self.ramp_rise_s,
        )

    @property
    def target_rate_per_replica(self) -> float:
        """What an operator configures: measured capacity x target utilisation."""
        return self.target_utilization * self.engine.max_rate(self.settings.kv_usage_ceiling)

    def settings_for(self, key: str) -> AutoscaleSettings:
        """The gateway's AutoscaleSettings under strategy ``key``: P configures the rate term
        (target_rate_per_replica, backlog_drain_s, rate_window_s); the others keep ``settings``."""
        if key != "P":
            return self.settings
        return AutoscaleSettings.model_validate(
            {
                **self.settings.model_dump(),
                "target_rate_per_replica": self.target_rate_per_replica,
                "backlog_drain_s": self.backlog_drain_s,
                "rate_window_s": self.rate_window_s,
            }
        )


@dataclass(frozen=True, slots=True)
class Strategy:
    key: str
    label: str
    metric: str
    target: float
    stabilized: bool
    """The metric is the gateway's desired count, already scale-down stabilized: the HPA runs
    with hpa_scale_down_window_s rather than queue_hpa_scale_down_window_s."""


STRATEGY_KEYS = ("A", "B", "C", "P")


def strategies(config: ScalingConfig) -> dict[str, Strategy]:
    s = config.settings
    desired = "gateway_pool_desired_replicas"
    return {
        "A": Strategy("A", "gateway desired (default settings)", desired, 1, True),
        "B": Strategy("B", "engine waiting queue (vLLM stack)", f"sum({NUM_WAITING})", 5, False),
        "C": Strategy(
            "C",
            "gateway queue depth",
            "gateway_pool_queue_depth",
            s.target_queue_per_replica,
            False,
        ),
        "P": Strategy("P", "gateway desired (target rate set)", desired, 1, True),
    }


def baseline_settings(
    settings: AutoscaleSettings, engine: EngineModel, base_rate: float
) -> AutoscaleSettings:
    """The settings with min_replicas at the right value for the base load, as an operator
    sizes the floor, so that every strategy starts from the same steady state."""
    floor = right_replicas(base_rate, engine, settings.model_copy(update={"min_replicas": 1}))
    return AutoscaleSettings.model_validate(
        {**settings.model_dump(), "min_replicas": min(floor, settings.max_replicas)}
    )
