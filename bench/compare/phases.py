"""Goodput per phase of an open-loop run whose arrival rate changes (the overload workload).

A request belongs to the phase its arrival fell in, wherever it finished: a backlog built in
the burst and served late counts against the burst. Goodput = requests of the phase that
finished with a TTFT within the objective, per second of the phase.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.driver import RequestResult, percentile


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """How to cut a run into phases: their names and [start, end) in seconds of the
    schedule, and the TTFT objective a request must meet to count as good."""

    names: tuple[str, ...]
    bounds: tuple[tuple[float, float], ...]
    ttft_objective_s: float

    def __post_init__(self) -> None:
        if len(self.names) != len(self.bounds):
            raise ValueError("one name per phase")

    @property
    def duration_s(self) -> float:
        return self.bounds[-1][1] - self.bounds[0][0] if self.bounds else 0.0


@dataclass(frozen=True, slots=True)
class PhaseFigures:
    """One phase of one run (or, named "all", the whole run)."""

    name: str
    duration_s: float
    arrived: int
    good: int
    """Finished without error, TTFT within the objective."""
    ttft_p99_s: float
    """Over the phase's successful requests; NaN when none succeeded."""

    @property
    def goodput(self) -> float:
        """Good requests per second of the phase."""
        return self.good / self.duration_s if self.duration_s > 0 else math.nan


def phase_figures(
    results: Sequence[RequestResult], arrivals: Mapping[str, float], spec: PhaseSpec
) -> tuple[PhaseFigures, ...]:
    """Each phase's figures, then the whole run's (named "all"). ``arrivals`` maps each
    conversation id to its arrival offset; a one-round conversation is one request."""

    def figures(name: str, start: float, end: float) -> PhaseFigures:
        mine = [r for r in results if start <= arrivals.get(r.conversation, math.nan) < end]
        ttfts = [r.ttft_s for r in mine if r.ok and r.ttft_s is not None]
        good = sum(1 for t in ttfts if t <= spec.ttft_objective_s)
        return PhaseFigures(name, end - start, len(mine), good, percentile(ttfts, 99))

    phases = [figures(n, s, e) for n, (s, e) in zip(spec.names, spec.bounds, strict=True)]
    if not spec.bounds:
        return ()
    whole = figures("all", spec.bounds[0][0], spec.bounds[-1][1])
    return (*phases, whole)
