"""The PNGs of docs/benchmarks.md: TTFT CDFs, hit rate against the bound, requests per
replica. They need matplotlib (the ``bench`` extra) and are skipped, with a note, without it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.compare.checks import GSP_BOUND_FRACTION, ZIPF_MAX_OVER_MEAN
from bench.compare.markdown import pct
from bench.compare.results import (
    FleetResult,
)
from bench.compare.seeds import all_figures, figures, mean


def plots_available() -> str | None:
    """None when matplotlib can draw; otherwise why not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    return None


def write_plots(fleet: FleetResult, out_dir: Path) -> list[str]:
    """The fleet's three PNGs in ``out_dir``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in fleet.workloads if fleet.for_workload(w.key)]
    if not workloads:
        return []
    names = []
    cols = min(2, len(workloads))
    rows = math.ceil(len(workloads) / cols)
    colors = {t.label: plt.get_cmap("tab10")(i) for i, t in enumerate(fleet.targets)}

    # 1. TTFT CDF, one panel per workload (every seed's requests together).
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, workload in zip(axes.flat, workloads, strict=False):
        for f in all_figures(fleet, workload.key):
            ttfts = sorted(1000 * t for m in f.runs for t in m.ttfts)
            if not ttfts:
                continue
            ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            style = "-" if f.target.kind == "gateway" else "--"
            ax.step(ttfts, ys, where="post", label=f.target.label, linestyle=style,
                    color=colors[f.target.label])  # fmt: skip
        ax.set_xscale("log")
        ax.set_title(workload.title)
        ax.set_xlabel("TTFT (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    _blank_unused(axes, len(workloads))
    fig.suptitle(f"{fleet.title}: TTFT CDF per target")
    names.append(_save(fig, out_dir, f"bench-{fleet.key}-ttft-cdf.png"))

    # 2. Hit rate as a fraction of the affinity bound.
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(workloads)), 4.2))
    width = 0.8 / max(1, len(fleet.targets))
    for i, target in enumerate(fleet.targets):
        values = []
        for workload in workloads:
            found = figures(fleet, workload.key, target)
            fraction = mean(found.hit_fraction) if found else 0.0
            values.append(0.0 if math.isnan(fraction) else fraction)
        xs = [j + (i - (len(fleet.targets) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(xs, values, width, label=target.label, color=colors[target.label])
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(GSP_BOUND_FRACTION, color="grey", linewidth=1, linestyle=":")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(
        [f"{w.title}\n(bound {pct(_bound(fleet, w.key))})" for w in workloads], fontsize=8
    )
    ax.set_ylabel("fleet hit rate / affinity bound")
    ax.set_ylim(0, 1.4)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, GSP_BOUND_FRACTION, 1.0])
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    ax.set_title(f"{fleet.title}: hit rate as a fraction of the possible")
    names.append(_save(fig, out_dir, f"bench-{fleet.key}-hit-rate.png"))

    # 3. Requests per replica, normalised by the mean, per workload.
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, workload in zip(axes.flat, workloads, strict=False):
        table = all_figures(fleet, workload.key)
        for i, f in enumerate(table):
            for m in f.runs:
                counts = m.requests_per_replica
                average = sum(counts) / len(counts) if counts and sum(counts) else 1.0
                ax.scatter([i] * len(counts), [c / average for c in counts], s=18,
                           color=colors[f.target.label], alpha=0.8)  # fmt: skip
            balance = mean(f.balance)
            if not math.isnan(balance):
                ax.annotate(f"{balance:.2f}", (i, balance), textcoords="offset points",
                            xytext=(6, 0), fontsize=7)  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=1)
        ax.axhline(ZIPF_MAX_OVER_MEAN, color="grey", linewidth=1, linestyle=":")
        ax.set_xticks(range(len(table)))
        ax.set_xticklabels([f.target.label for f in table], rotation=30, ha="right",
                           fontsize=7)  # fmt: skip
        ax.set_ylabel("requests / mean per replica")
        ax.set_title(workload.title)
        ax.grid(True, axis="y", alpha=0.3)
    _blank_unused(axes, len(workloads))
    fig.suptitle(f"{fleet.title}: requests per replica (dots, every seed), mean max/mean annotated")
    names.append(_save(fig, out_dir, f"bench-{fleet.key}-requests-per-replica.png"))
    return names


def _bound(fleet: FleetResult, workload: str) -> float | None:
    measurements = fleet.for_workload(workload)
    return measurements[0].bound.bound if measurements else None


def _blank_unused(axes: Any, used: int) -> None:
    """Hides the grid's panels past the first ``used`` (an odd number of workloads)."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")


def _save(fig: Any, out_dir: Path, name: str) -> str:
    """Lays out, writes and closes ``fig``; returns its file name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
