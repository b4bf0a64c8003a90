"""The overload workload on its own simulated fleet: 1.3x the fleet's capacity, then 0.6x.

The default sims batch 16 sequences at ~20k prefill tokens/s: eight of them serve far more
than this 2-core machine can send and stream. So this fleet's sims are slowed (4 sequences at
most, a 50 ms decode step) until the fleet saturates at ~10 requests/s, a rate the machine
sends comfortably: the queueing is the replicas', not the client's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench.compare.phases import PhaseSpec
from bench.compare.plan import OVERLOAD, SIM_REPLICAS, PlannedWorkload
from bench.compare.results import PREFIX_AWARE, WorkloadInfo
from bench.compare.runner import SimVariant
from bench.workloads import split_schedule, total_requests
from bench.workloads_overload import OVERLOAD_PHASES, overload
from replica.sim.config import SimConfig

OVERLOAD_SIM: dict[str, Any] = {"max_num_seqs": 4, "decode_step_s": 0.05}
"""The sims' settings on this fleet (the rest are the defaults)."""
TTFT_OBJECTIVE_S = 2.0
"""A request is good when its first token comes within this: ~25x an idle replica's TTFT."""
TIME_SCALE, QUICK_TIME_SCALE = 0.5, 0.1
"""The issue's 60 s phases, shrunk to 30 s (to 6 s for --quick) to fit the run here."""
SYSTEM_TOKENS, QUESTION_TOKENS, OUTPUT_TOKENS, GROUPS = 1024, 128, 64, 16


def capacity_rps(config: SimConfig, replicas: int, uncached_tokens: int, output: int) -> float:
    """Requests/s the fleet finishes when saturated, from the sims' timing model.

    A saturated replica runs ``max_num_seqs`` sequences; every second it spends
    ``requests x uncached tokens x prefill_s_per_token`` on prefill and runs decode steps of
    ``decode_step_s + decode_s_per_seq x max_num_seqs``, each advancing every sequence by one
    token, so a request costs ``(output - 1) x step / max_num_seqs`` of decode time.
    """
    seqs = config.max_num_seqs
    step = config.decode_step_s + config.decode_s_per_seq * seqs
    per_request = (output - 1) * step / seqs + uncached_tokens * config.prefill_s_per_token
    return replicas / per_request


def overload_config() -> SimConfig:
    return SimConfig.model_validate(OVERLOAD_SIM)


def fleet_capacity(replicas: int = SIM_REPLICAS) -> float:
    """The overload fleet's capacity with every system prompt served from cache (the best any
    routing can do): only the question and the template's few tokens are prefilled."""
    return capacity_rps(overload_config(), replicas, QUESTION_TOKENS + 16, OUTPUT_TOKENS)


def overload_workload(quick: bool, seed: int = 0, replicas: int = SIM_REPLICAS) -> PlannedWorkload:
    capacity = fleet_capacity(replicas)
    scale = QUICK_TIME_SCALE if quick else TIME_SCALE
    schedule = overload(
        capacity,
        OVERLOAD_PHASES,
        seed,
        time_scale=scale,
        groups=GROUPS,
        system_tokens=SYSTEM_TOKENS,
        question_tokens=QUESTION_TOKENS,
        output_tokens=OUTPUT_TOKENS,
    )
    arrivals, conversations = split_schedule(schedule)
    bounds, start = [], 0.0
    for phase in OVERLOAD_PHASES:
        bounds.append((start, start + phase.duration_s * scale))
        start += phase.duration_s * scale
    names = tuple(f"{p.load:g}x for {p.duration_s * scale:g} s" for p in OVERLOAD_PHASES)
    spec = PhaseSpec(names, tuple(bounds), TTFT_OBJECTIVE_S)
    phases_text = ", then ".join(names)
    info = WorkloadInfo(
        OVERLOAD,
        "Overload",
        "The issue's overload: open loop at 1.3x the fleet's capacity for 60 s, then 0.6x for "
        "60 s; goodput = requests whose first token came within the TTFT objective, per second.",
        f"{GROUPS} groups (uniform), system prompt {SYSTEM_TOKENS}, question {QUESTION_TOKENS}, "
        f"output {OUTPUT_TOKENS} tokens; phases x {scale:g}: {phases_text}; capacity "
        f"{capacity:.2f} requests/s (derived, see the fleet); TTFT objective "
        f"{TTFT_OBJECTIVE_S:g} s.",
        total_requests(conversations),
        f"open loop, Poisson at {phases_text} of {capacity:.2f} requests/s (seeded)",
        (seed,),
    )
    return PlannedWorkload(info, conversations, arrivals, seed, phases=spec)


def overload_description(replicas: int) -> list[str]:
    config = overload_config()
    step = config.decode_step_s + config.decode_s_per_seq * config.max_num_seqs
    return [
        f"- Replicas: {replicas} simulated vLLM replicas slowed to saturate at a rate this "
        f"machine can send: at most {config.max_num_seqs} running sequences, decode step "
        f"{config.decode_step_s * 1000:g} ms + {config.decode_s_per_seq * 1000:g} ms per "
        f"sequence; other settings default (KV {config.num_blocks:,} blocks of "
        f"{config.block_size} tokens, prefill {config.prefill_s_per_token * 1e6:.0f} us/token).",
        f"- Capacity (derived from the sims' timing model, bench/compare/overload.py "
        f"`capacity_rps`): a saturated replica spends ({OUTPUT_TOKENS} - 1) x {step * 1000:.1f} "
        f"ms / {config.max_num_seqs} of decode and ~{QUESTION_TOKENS + 16} prefill tokens per "
        f"request, so the fleet finishes {fleet_capacity(replicas):.2f} requests/s when every "
        "system prompt hits (a cold one adds ~51 ms of prefill per request, -6%).",
        f"- TTFT objective {TTFT_OBJECTIVE_S:g} s; a request counts in the phase it arrived in. "
        "No target is told it (like for like: the peers take no such setting). "
        f"`{OVERLOAD_OBJECTIVE_TARGET.label}` is the gateway told it "
        "(`cost.ttft_objective_s`), as an operator states an SLO: reported beside the others, "
        "read by no check.",
    ]


OVERLOAD_OBJECTIVE_TARGET = replace(PREFIX_AWARE, objective_s=TTFT_OBJECTIVE_S)
"""The gateway told the goodput objective: reported apart, since no peer can be told it."""


OVERLOAD_VARIANT = SimVariant(
    "overload", "Overload on a slowed simulated fleet", overload_description, OVERLOAD_SIM
)
