"""The workloads ``bench compare`` sends, built from their published definitions and sized
for this machine."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.compare.phases import PhaseSpec
from bench.compare.results import (
    WorkloadInfo,
)
from bench.workloads import (
    Conversation,
    generated_shared_prefix,
    low_sharing,
    multi_turn_shared_prefix,
    poisson_arrivals,
    total_requests,
    zipf_groups,
)

SIM_MODEL = "sim-model"
SIM_REPLICAS = 8
REAL_MODEL = "small-llama"
REAL_SIZE = "small"


GSP, MRQA, LOW, ZIPF, REAL_GSP = "gsp", "mrqa", "low", "zipf", "real-gsp"
AGENTS, OVERLOAD, MOONCAKE = "agents", "overload", "mooncake"
SEEDED = (GSP, ZIPF, REAL_GSP, OVERLOAD)
"""The workloads run on every seed given; the others run on the first seed only. Overload's
goodput moves with its seed's arrivals by more than the targets differ (round robin 1.45 to
3.23/s over seeds 6-10): one seed's result is no comparison."""
SIM_FLEET_WORKLOADS = (GSP, MRQA, LOW, ZIPF, AGENTS, OVERLOAD)
"""What ``bench compare --workloads`` may name: the simulated fleets' workloads."""
TUNING_SEEDS = (0, 1, 2, 3, 4, 5)
"""Seeds routing parameters were chosen on: spread_factor, copy_weight 1, the valley rule and
the placement rule on Zipf 0-5; copy_weight's later value was checked on gsp and Zipf 3-4."""
DEFAULT_SEEDS = (6, 7, 8)
"""The report seeds, on which no parameter was chosen: the acceptance checks read these."""


@dataclass(frozen=True, slots=True)
class PlannedWorkload:
    """A workload as it will be sent: conversations, their arrival times, and its description."""

    info: WorkloadInfo
    conversations: list[Conversation]
    arrivals: list[float] | None
    """Open loop: each conversation's start offset. None: closed loop at ``concurrency``."""
    seed: int = 0
    concurrency: int | None = None
    """Requests in flight at most; None for open loop (a bound the run never reaches)."""
    phases: PhaseSpec | None = None
    """Report goodput per arrival phase (the overload workload)."""
    gateway_pool: Mapping[str, Any] = field(default_factory=dict)
    """Pool settings every gateway target is given for this workload, as an operator would
    (`bench diagnose --set`)."""


def planned(
    key: str,
    title: str,
    definition: str,
    parameters: str,
    conversations: list[Conversation],
    rate: float,
    seed: int,
    per: str = "request",
) -> PlannedWorkload:
    arrivals = poisson_arrivals(len(conversations), rate, seed)
    arrival = f"open loop, Poisson, {rate:g} {per}s/s (seeded: every target gets the same times)"
    info = WorkloadInfo(
        key, title, definition, parameters, total_requests(conversations), arrival, (seed,)
    )
    return PlannedWorkload(info, conversations, arrivals, seed)


@dataclass(frozen=True, slots=True)
class SimScale:
    """The simulated fleet's workload sizes and load, fixed from the definitions and this machine.

    Lengths stay at their definitions' values except the output, cut 8x (256 -> 32 tokens):
    every output token is a streamed chunk that client, router and replica all handle on this
    machine's 2 cores. Generated-shared-prefix keeps SGLang's 16 prompts per group and halves
    its 64 groups, so that one run takes ~16 s.
    """

    groups: int = 32
    prompts_per_group: int = 16
    users: int = 48
    rounds: int = 5
    rate: float = 32.0
    """Requests/s of the one-round workloads: ~45% of the fleet's cold-prefill capacity (8
    replicas x 20k tokens/s over ~2,200-token prompts = ~73 requests/s), where routing decides
    queueing but nothing saturates; the machine's CPU stays at about a quarter."""
    user_rate: float = 4.0
    """Multi-round QA users joining per second; each sends its rounds back to back, so ~20
    users are active at once and send ~20 requests/s."""
    output_tokens: int = 32

    @classmethod
    def quick(cls) -> SimScale:
        return cls(groups=16, prompts_per_group=4, users=12, rounds=3)

    @property
    def prefix_tokens(self) -> int:
        """All groups' 2,048-token system prompts together."""
        return self.groups * 2048


def sim_workloads(
    scale: SimScale, seeds: Sequence[int] = (0,), seeded: Collection[str] = SEEDED
) -> list[PlannedWorkload]:
    """The four simulated-fleet workloads, from their definitions scaled as ``scale`` says:
    those in ``seeded`` (generated-shared-prefix and Zipf) once per seed (seed after seed), the
    others on the first seed only."""
    return over_seeds(lambda seed: _sim_workloads(scale, seed), seeds, seeded)


def over_seeds(
    make: Callable[[int], list[PlannedWorkload]],
    seeds: Sequence[int],
    seeded: Collection[str] = SEEDED,
) -> list[PlannedWorkload]:
    """``make``'s workloads for each seed in turn: those in ``seeded`` on every seed, the
    others on the first only. Each seeded workload's info lists all the seeds, so that its
    report row can say what its means are over."""
    if not seeds:
        raise ValueError("at least one seed")
    planned_: list[PlannedWorkload] = []
    for index, seed in enumerate(seeds):
        for workload in make(seed):
            if index == 0 or workload.info.key in seeded:
                planned_.append(workload)
    return [
        replace(w, info=replace(w.info, seeds=tuple(seeds))) if w.info.key in seeded else w
        for w in planned_
    ]


def _sim_workloads(scale: SimScale, seed: int) -> list[PlannedWorkload]:
    s = scale
    requests = s.groups * s.prompts_per_group
    return [
        planned(
            GSP,
            "Generated shared prefix",
            "SGLang's generated-shared-prefix: 64 groups x 16 prompts, 2,048-token system "
            "prompt per group, 128-token question, 256-token output.",
            f"{s.groups} groups x {s.prompts_per_group} prompts, system prompt 2,048, question "
            f"128, output {s.output_tokens} tokens (groups / {64 / s.groups:g}, prompts per "
            f"group / {16 / s.prompts_per_group:g}, output / {256 / s.output_tokens:g}).",
            generated_shared_prefix(
                s.groups, s.prompts_per_group, 2048, 128, s.output_tokens, seed
            ),
            s.rate,
            seed,
        ),
        planned(
            MRQA,
            "Multi-round QA",
            "vLLM production stack's multi-round QA: N users, R rounds each, one shared "
            "1,000-token system prompt, each round resends the user's history, ~100-token "
            "answers.",
            f"{s.users} users x {s.rounds} rounds, shared system prompt 1,000, question 128, "
            "answer 100 tokens (one group of `multi_turn_shared_prefix`).",
            multi_turn_shared_prefix(1, s.users, s.rounds, 1000, 128, 100, seed),
            s.user_rate,
            seed,
            per="user",
        ),
        planned(
            LOW,
            "Low sharing (control)",
            "llm-d's low-sharing control: a short shared part and a long unique part; "
            "prefix routing must not lose to load-only routing.",
            f"{s.groups} groups x {s.prompts_per_group} prompts, shared 128, unique 2,048, "
            f"output {s.output_tokens} tokens (generated-shared-prefix with the shared and "
            "unique lengths swapped).",
            low_sharing(s.groups, s.prompts_per_group, 128, 2048, s.output_tokens, seed),
            s.rate,
            seed,
        ),
        planned(
            ZIPF,
            "Zipf popularity",
            "Skewed popularity: each request's prefix group drawn from a Zipf distribution "
            "(one hot system prompt); pinning must not overload one replica.",
            f"{requests} requests over {s.groups} groups, Zipf exponent 1.0 (the hot group gets "
            f"~{100 / sum(1 / k for k in range(1, s.groups + 1)):.0f}% of requests), system "
            f"prompt 2,048, question 128, output {s.output_tokens} tokens.",
            zipf_groups(s.groups, requests, 1.0, 2048, 128, s.output_tokens, seed),
            s.rate,
            seed,
        ),
    ]


def real_workloads(quick: bool, seeds: Sequence[int] = (0,)) -> list[PlannedWorkload]:
    """The real fleet's shared-prefix workload, sized for a 41M-parameter model on one core,
    once per seed: with 24 requests, 4 of them cold, one run's mean TTFT moves by more than
    the routers differ."""
    return over_seeds(lambda seed: _real_workloads(quick, seed), seeds)


def _real_workloads(quick: bool, seed: int) -> list[PlannedWorkload]:
    groups, prompts = (4, 3) if quick else (4, 6)
    return [
        planned(
            REAL_GSP,
            "Shared prefix on real vLLM",
            "SGLang's generated-shared-prefix shape.",
            f"{groups} groups x {prompts} prompts, system prompt 2,048 characters (~930 tokens "
            "of the model's BPE), question 128 characters, output 16 tokens.",
            generated_shared_prefix(groups, prompts, 512, 32, 16, seed),
            1.0,
            seed,
        )
    ]
