"""Overload: open-loop arrivals above the fleet's capacity, then back below it.

The arrival process is Poisson with a rate that is constant within each phase: ``load`` x the
fleet's capacity (requests per second, measured for this request shape by the caller). The
default phases are the issue's: 60 s at 1.3x capacity, then 60 s at 0.6x, long enough to drain
the backlog the first phase leaves (0.3 x capacity x 60 s of work, drained at 0.4 x capacity:
~45 s). ``time_scale`` shrinks every phase for tests and small machines.

Requests are one-round shared-prefix requests (generated-shared-prefix's shape: a group's
system prompt, then a question of its own), each group drawn per request from a Zipf law
(``exponent`` 0 = uniform). A router must neither collapse onto one replica under the burst
nor stay unbalanced after it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bench.workloads import Conversation, Schedule, random_text, zipf_weights

WORKLOAD_SYSTEM = "You are the assistant of team {group}."


@dataclass(frozen=True, slots=True)
class Phase:
    """``duration_s`` seconds of arrivals at ``load`` x the fleet's capacity."""

    duration_s: float
    load: float


OVERLOAD_PHASES: tuple[Phase, ...] = (Phase(60.0, 1.3), Phase(60.0, 0.6))


def phase_arrivals(
    capacity_rps: float, phases: Sequence[Phase], seed: int = 0, time_scale: float = 1.0
) -> list[float]:
    """Arrival offsets in seconds of a Poisson process whose rate follows the phases.

    Within a phase the gaps are exponential at ``load x capacity_rps``; at a phase boundary
    the process restarts at the new rate (exact, since the exponential is memoryless).
    """
    if capacity_rps <= 0:
        raise ValueError("capacity_rps must be > 0")
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    rng = random.Random(f"{seed}:overload:arrivals")
    arrivals: list[float] = []
    start = 0.0
    for phase in phases:
        if phase.duration_s < 0 or phase.load < 0:
            raise ValueError(f"a phase needs a duration and a load >= 0, not {phase}")
        end = start + phase.duration_s * time_scale
        rate = phase.load * capacity_rps
        at = start
        while rate > 0:
            at += rng.expovariate(rate)
            if at >= end:
                break
            arrivals.append(at)
        start = end
    return arrivals


def overload(
    capacity_rps: float,
    phases: Sequence[Phase] = OVERLOAD_PHASES,
    seed: int = 0,
    *,
    time_scale: float = 1.0,
    groups: int = 16,
    exponent: float = 0.0,
    system_tokens: int = 1024,
    question_tokens: int = 128,
    output_tokens: int = 64,
) -> Schedule:
    """(arrival offset, one-round request) pairs in arrival order; a pure function of its
    arguments. Send it open loop: ``split_schedule`` then ``run_conversations(..., arrivals=)``
    with a concurrency the run never reaches."""
    arrivals = phase_arrivals(capacity_rps, phases, seed, time_scale)
    rng = random.Random(f"{seed}:overload:groups")
    picks = rng.choices(range(groups), weights=zipf_weights(groups, exponent), k=len(arrivals))
    systems: dict[int, str] = {}
    schedule: Schedule = []
    for index, (at, group) in enumerate(zip(arrivals, picks, strict=True)):
        if group not in systems:
            lead = WORKLOAD_SYSTEM.format(group=group + 1)
            systems[group] = random_text(
                random.Random(f"{seed}:overload:system:{group}"), system_tokens, lead
            )
        question = random_text(random.Random(f"{seed}:overload:question:{index}"), question_tokens)
        conversation = Conversation(
            id=f"o{index:05d}-g{group:03d}",
            group=group,
            system=systems[group],
            questions=(question,),
            max_tokens=output_tokens,
        )
        schedule.append((at, conversation))
    return schedule


def phase_of(at: float, phases: Sequence[Phase], time_scale: float = 1.0) -> int:
    """The index of the phase an arrival offset falls in (the last one for later offsets), so
    results can be reported per phase (burst, recovery)."""
    start = 0.0
    for index, phase in enumerate(phases):
        start += phase.duration_s * time_scale
        if at < start:
            return index
    return len(phases) - 1
