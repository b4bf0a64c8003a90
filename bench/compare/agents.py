"""The long-context agents workload on its own simulated fleet, whose sims take 64k-token
prompts and hold 16x the default KV cache; the other workloads keep the default fleet, so
their regime (cache pressure, queueing) does not change."""

from __future__ import annotations

from typing import Any

from bench.compare.plan import AGENTS, PlannedWorkload
from bench.compare.results import WorkloadInfo
from bench.compare.runner import SimVariant
from bench.workloads import Conversation, total_requests
from bench.workloads_agents import long_context_agents
from replica.sim.config import SimConfig

AGENTS_SIM: dict[str, Any] = {"max_model_len": 65536, "num_blocks": 16384}
"""The sims' settings on this fleet (the rest are the defaults)."""
CONCURRENCY = 8
"""Closed loop: requests in flight, as the workload's author ran it."""


def agents_workload(quick: bool, seed: int = 0) -> PlannedWorkload:
    """The issue's shape (8 agents, 40 KB leads, 32 conversations growing to ~200 KB over
    10-20 turns); --quick keeps 4 agents, 8 conversations, 20 KB leads, 60 KB over 3-5 turns."""
    if quick:
        sizes = {"agents": 4, "conversations": 8, "lead_chars": 20_000, "final_chars": 60_000}
        turns = (3, 5)
    else:
        sizes = {"agents": 8, "conversations": 32, "lead_chars": 40_000, "final_chars": 200_000}
        turns = (10, 20)
    conversations: list[Conversation] = []
    conversations += long_context_agents(
        **sizes, min_turns=turns[0], max_turns=turns[1], answer_tokens=32, seed=seed
    )
    info = WorkloadInfo(
        AGENTS,
        "Long-context agents",
        "The issue's agents: 8 agents, each with a ~40 KB shared lead (system prompt + tool "
        "schemas in the body's `tools`), 32 conversations that grow by tool calls and tool "
        "results to ~200 KB over 10-20 turns (bench/workloads_agents.py).",
        f"{sizes['agents']} agents, {sizes['conversations']} conversations, lead "
        f"{sizes['lead_chars']:,} characters (half tool schemas), last turn "
        f"{sizes['final_chars']:,} characters (~{sizes['final_chars'] // 4:,} tokens), "
        f"{turns[0]}-{turns[1]} turns, 32-token answers.",
        total_requests(conversations),
        f"closed loop, {CONCURRENCY} requests in flight; each conversation's turns in order, "
        "every conversation started at once",
        (seed,),
    )
    return PlannedWorkload(info, conversations, None, seed, concurrency=CONCURRENCY)


def agents_description(replicas: int) -> list[str]:
    config = SimConfig.model_validate(AGENTS_SIM)
    kv_tokens = config.num_blocks * config.block_size
    return [
        f"- Replicas: {replicas} simulated vLLM replicas with max_model_len "
        f"{config.max_model_len:,} and {config.num_blocks:,} KV blocks of {config.block_size} "
        f"tokens ({kv_tokens:,} tokens each, {replicas * kv_tokens:,} for the fleet); other "
        "settings default.",
        "- Affinity bound: over the prompts as rendered with their tools (the sim's template "
        "puts the tool schemas first), exact for this fleet.",
    ]


AGENTS_VARIANT = SimVariant(
    "agents", "Long-context agents on a large-KV simulated fleet", agents_description, AGENTS_SIM
)
