"""A target's figures on a workload over its seeds: the mean, which the checks read, and the
range (min-max), which shows how much one seed's draw of text and arrivals moves them."""

from __future__ import annotations

import math
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
