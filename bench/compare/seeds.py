"""A target's figures on a workload over its seeds: the mean, which the checks read, and the
range (min-max), which shows how much one seed's draw of text and arrivals moves them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from bench.compare.results import FleetResult, Measurement, Target


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and range of one figure over seeds."""

    mean: float
    low: float
    high: float
    count: int

    def text(self, show: Callable[[float], str]) -> str:
        """``mean (low-high)``, or just the mean for one seed."""
        if self.count <= 1:
            return show(self.mean)
        return f"{show(self.mean)} ({show(self.low)}-{show(self.high)})"


def spread(values: Iterable[float | None]) -> Spread | None:
    """Over the values that exist (not None, not NaN); None when there are none."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    if not kept:
        return None
    return Spread(sum(kept) / len(kept), min(kept), max(kept), len(kept))


def mean(value: Spread | None) -> float:
    return math.nan if value is None else value.mean


@dataclass(frozen=True, slots=True)
class Figures:
    """One target on one workload, over every seed it ran."""

    target: Target
    runs: tuple[Measurement, ...]

    def over(self, figure: Callable[[Measurement], float | None]) -> Spread | None:
        return spread(figure(m) for m in self.runs)

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(m.seed for m in self.runs)

    @property
    def hit_rate(self) -> Spread | None:
        return self.over(lambda m: m.hit_rate)

    @property
    def hit_fraction(self) -> Spread | None:
        return self.over(lambda m: m.hit_fraction_of_bound)

    @property
    def bound(self) -> Spread | None:
        return self.over(lambda m: m.bound.bound)

    def ttft(self, q: float) -> Spread | None:
        return self.over(lambda m: m.ttft(q))

    @property
    def mean_ttft(self) -> Spread | None:
        return self.over(lambda m: m.mean_ttft)

    @property
    def balance(self) -> Spread | None:
        return self.over(lambda m: m.balance)

    @property
    def planned(self) -> int:
        return sum(m.planned for m in self.runs)

    @property
    def lost(self) -> int:
        """Requests planned but not answered (failed or never sent): the latencies and hit
        rates cover only the rest, so they flatter a target that lost its slowest."""
        return sum(m.errors + m.not_sent for m in self.runs)

    @property
    def first_error(self) -> str | None:
        return next((m.first_error for m in self.runs if m.first_error), None)


@dataclass(frozen=True, slots=True)
class Paired:
    """One figure's per-seed differences between two targets (ours less theirs) over the
    seeds both ran: each seed's draw of text and arrivals moves both alike, so the spread of
    the differences is the run-to-run spread of the comparison itself."""

    mean: float
    twice_se: float
    """Twice the standard error of ``mean`` (stdev / sqrt(count))."""
    count: int

    @property
    def tie(self) -> bool:
        return abs(self.mean) <= self.twice_se


def paired(
    ours: Figures, theirs: Figures, figure: Callable[[Figures], Spread | None]
) -> Paired | None:
    """Over the seeds both ran and both have the figure for; None under two (no spread)."""
    by_seed = {m.seed: m for m in theirs.runs}
    differences = []
    for m in ours.runs:
        other = by_seed.get(m.seed)
        if other is None:
            continue
        a, b = figure(Figures(ours.target, (m,))), figure(Figures(theirs.target, (other,)))
        if a is not None and b is not None:
            differences.append(a.mean - b.mean)
    if len(differences) < 2:
        return None
    se = statistics.stdev(differences) / math.sqrt(len(differences))
    return Paired(statistics.fmean(differences), 2 * se, len(differences))


def figures(fleet: FleetResult, workload: str, target: Target) -> Figures | None:
    """The target's figures on the workload; None when it did not run it."""
    runs = fleet.runs(workload, target)
    return Figures(target, tuple(runs)) if runs else None


def all_figures(fleet: FleetResult, workload: str) -> list[Figures]:
    """Every target that ran the workload, in the fleet's target order."""
    found = (figures(fleet, workload, t) for t in fleet.targets)
    return [f for f in found if f is not None]


def seeds_text(seeds: Sequence[int]) -> str:
    return ",".join(str(s) for s in seeds)
