"""The report's method section, and notes that explain the checks from the figures."""

from __future__ import annotations

from collections.abc import Sequence

from bench.compare.checks import Check, ttft_ratio_text
from bench.compare.comparison import CompareResult
from bench.compare.markdown import ratio
from bench.compare.plan import GSP, LOW, REAL_GSP, ZIPF
from bench.compare.results import (
    CACHE_AWARE_PEERS,
    LEAST_LOADED,
    PREFIX_AWARE,
    ROUND_ROBIN,
    FleetResult,
    Measurement,
)
from bench.fleet_stats import HITS, QUERIES
from bench.replica_counters import REQUESTS
from replica.sim.config import SimConfig
from router_policies.decision import Route
from router_policies.schema import LoadSettings

METHOD = [
    "- Targets run one after another on the same replica processes. Each target's router is "
    "started fresh for each workload (no routing state carries over) and stopped after it. "
    "The gateway runs `llm-gateway serve` with a one-pool policy file where only `policy` is "
    "set (every other value is the default); the peers run with the flags of TOOLS.md and "
    "their own defaults (bench/peers/).",
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
    f"fleet hit rate = sum of `{HITS}` deltas / sum of `{QUERIES}` deltas; requests per "
    f"replica = each replica's `{REQUESTS}` delta.",
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
        # Sent away from the replica holding the prefix because it was at the load cap.
        diverted = _route_count(pa, Route.LEAST_LOADED)
        named = f"`{Route.LEAST_LOADED}`"
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
                f"worker: max/mean requests per replica {ratio(best.balance)} against "
                f"prefix-aware's {ratio(pa.balance)}."
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
            + f" ({_share(_route_count(pa_low, Route.PREFIX_HOME), pa_low.sent)} requests went to "
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
