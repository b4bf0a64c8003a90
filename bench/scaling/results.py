"""What a run records (time series per strategy) and the figures it is judged on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.scaling.config import ScalingConfig, Scenario, Strategy


@dataclass(slots=True)
class Series:
    """One strategy in one scenario: 1 s samples (t), scrapes (scrape_t), HPA syncs (hpa_t)."""

    t: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    pods: list[int] = field(default_factory=list)
    hpa_target: list[int] = field(default_factory=list)
    signal: list[float] = field(default_factory=list)
    queue_depth: list[int] = field(default_factory=list)
    gateway_waiting: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    scrape_t: list[float] = field(default_factory=list)
    scrape_signal: list[float] = field(default_factory=list)
    hpa_t: list[float] = field(default_factory=list)
    hpa_value: list[int] = field(default_factory=list)
    ttft_t: list[float] = field(default_factory=list)
    ttft_p50: list[float] = field(default_factory=list)
    ttft_p90: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Summary:
    right_after: int
    """The right replica count at the peak load after the event."""
    reach_intervals: float | None
    """Step only (NaN on a ramp): scrape intervals from the step until the scraped signal first
    is at least right_after; None if it never is."""
    signal_at_2: float
    """Step only: the scraped signal two scrape intervals after the step."""
    lag_intervals: float | None
    """Worst delay, over every rise of the right value, until the HPA target reaches it."""
    short_s: float
    """Seconds after the event with fewer ready replicas than the right value."""
    peak_signal: float
    peak_target: int
    max_changes_per_window: int
    """Most direction changes of the HPA target within any stabilization window."""
    total_changes: int
    ready_at_s: float | None
    """Seconds from the event until right_after replicas first serve."""
    ttft_p50_s: float
    ttft_p90_s: float
    """TTFT of requests arriving after the event (step: 300 s; ramp: the rise and the fall);
    those still without a first token at the end count with the time they waited."""
    replica_s: float
    """Pod-seconds, from creation (a starting pod holds its GPU) until removed and drained."""
    ideal_replica_s: float
    """The right value integrated over the run: perfect foresight and no cold start."""
    unserved: int
    """Requests without a first token at the end of the run."""

    @property
    def acceptance(self) -> bool:
        """Signal at the right value within 2 scrape intervals of a step, and at most one
        direction change of the HPA target per stabilization window."""
        return (
            self.reach_intervals is not None
            and self.reach_intervals <= 2
            and self.max_changes_per_window <= 1
        )


@dataclass(frozen=True, slots=True)
class StrategyOutcome:
    strategy: Strategy
    series: Series
    summary: Summary


@dataclass(frozen=True, slots=True)
class ScenarioOutcome:
    scenario: Scenario
    arrivals: int
    outcomes: tuple[StrategyOutcome, ...]


@dataclass(frozen=True, slots=True)
class ScalingResult:
    config: ScalingConfig
    scenarios: tuple[ScenarioOutcome, ...]


def first_at_least(
    times: Sequence[float], values: Sequence[float], start: float, level: float
) -> float | None:
    return next((t for t, v in zip(times, values, strict=True) if t >= start and v >= level), None)


def worst_lag(times: Sequence[float], right: Sequence[int], target: Sequence[int]) -> float | None:
    """Longest wait, over every rise of the right value, until the HPA target reaches it."""
    worst = 0.0
    for i in range(1, len(right)):
        if right[i] > right[i - 1]:
            hit = first_at_least(times, target, times[i], right[i])
            if hit is None:
                return None
            worst = max(worst, hit - times[i])
    return worst


def direction_changes(times: Sequence[float], values: Sequence[int]) -> list[float]:
    """Times at which a series that was rising starts falling, or the other way round."""
    changes: list[float] = []
    last = 0
    for i in range(1, len(values)):
        delta = values[i] - values[i - 1]
        if delta == 0:
            continue
        sign = 1 if delta > 0 else -1
        if last and sign != last:
            changes.append(times[i])
        last = sign
    return changes


def max_direction_changes(times: Sequence[float], values: Sequence[int], window_s: float) -> int:
    """Most direction changes inside any window of window_s seconds."""
    changes = direction_changes(times, values)
    best, lo = 0, 0
    for hi, t in enumerate(changes):
        while changes[lo] < t - window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
