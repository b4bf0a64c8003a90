"""``llm-gateway bench compare``: the gateway against vllm-router and sglang-router, same fleet.

Targets, one after another on the same replicas: this gateway with prefix-aware, least-loaded
and round-robin routing; vllm-router round_robin and cache_aware; sglang-router cache_aware
(peers installed by bench/peers/install.sh, started with their documented flags, untuned).

Fleets:
  sim   8 simulated vLLM replicas (replica/sim, default timing and KV size) and four workloads:
        SGLang's generated-shared-prefix, vLLM production-stack's multi-round QA, llm-d's
        low-sharing control, and Zipf popularity over prefix groups, scaled to this machine;
        generated-shared-prefix and Zipf on 3 seeds (--seeds). Then two fleets of their own:
        long-context agents on 8 sims with 64k-token context and 16x the KV cache (closed
        loop), and overload on 8 sims slowed to saturate at ~10 requests/s on every seed (1.3x
        capacity, then 0.6x; goodput within a TTFT objective), and a window of Mooncake's public
        conversation trace replayed on 8 sims with 6x the KV cache (figures only, no check).
  real  2 real vLLM CPU replicas (the "small" ~41M-parameter Llama, one core each) and a small
        shared-prefix workload on 3 seeds, after an untimed rehearsal of it on every replica;
        gateway prefix-aware vs round-robin, and the cache-aware peers.

Before each target the replicas' prefix caches are emptied (POST /reset_prefix_cache) and their
counters checked to stand still. Hit rates and requests per replica come from the replicas'
own /metrics; every hit rate is also shown as a fraction of the workload's affinity bound.
Writes docs/benchmarks.md and PNG plots next to it.
"""

# Modules: ``plan`` (workloads), ``results``, ``seeds``, ``phases`` and ``checks`` (figures and
# acceptance), ``runner`` and ``fleets`` (what runs), ``agents``, ``overload`` and ``mooncake``
# (the workloads with fleets of their own), ``comparison`` (the whole run), ``notes``,
# ``markdown`` and ``plots`` (the report), ``code_state``, ``cli``.

from __future__ import annotations

from bench.compare.cli import add_arguments, run
from bench.compare.code_state import CodeState, code_line, source_digest
from bench.compare.comparison import CompareConfig, CompareResult, run_compare
from bench.compare.fleets import run_real_fleet, run_sim_fleet
from bench.compare.notes import sim_notes
from bench.compare.plan import PlannedWorkload, SimScale, planned, real_workloads, sim_workloads

__all__ = [
    "CodeState",
    "CompareConfig",
    "CompareResult",
    "PlannedWorkload",
    "SimScale",
    "add_arguments",
    "code_line",
    "planned",
    "real_workloads",
    "run",
    "run_compare",
    "run_real_fleet",
    "run_sim_fleet",
    "sim_notes",
    "sim_workloads",
    "source_digest",
]
