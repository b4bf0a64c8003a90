"""The text report of ``bench tiers`` and its ROC plot."""

from __future__ import annotations

from pathlib import Path

from bench.tier_eval.evaluation import (
    FIXED_THRESHOLD,
    OperatingPoint,
    TierEvalResult,
)


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}%"


def _point_line(name: str, p: OperatingPoint) -> str:
    return (
        f"  {name:<28} {p.threshold:9.4f} {_pct(p.large_share):>8} {_pct(p.precision):>9}"
        f" {_pct(p.recall):>8} {p.easy_sent_large:>10} {p.hard_sent_small:>10}"
    )


def _display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def format_report(result: TierEvalResult) -> str:
    r = result
    lines = [
        f"tier classifier on {_display_path(r.path)}",
        f"  {r.n} prompts: {r.n - r.n_hard} easy, {r.n_hard} hard ({_pct(r.n_hard / r.n).strip()})",
        f"  ROC AUC {r.auc:.3f}   mean score: easy {r.mean_score_easy:.3f}, "
        f"hard {r.mean_score_hard:.3f}",
        "",
        f"  {'operating point':<28} {'threshold':>9} {'large':>8} {'precision':>9}"
        f" {'recall':>8} {'easy->large':>10} {'hard->small':>10}",
        _point_line(f"calibrated (target {r.target_large_share:.0%})", r.calibrated),
        _point_line(f"fixed {FIXED_THRESHOLD}", r.fixed),
        "  (precision and recall of 'hard'; large = share of the set routed to the large pool)",
        "",
        f"  decision time: mean {r.mean_decision_us:.1f} us, slowest prompt "
        f"{r.max_decision_us:.1f} us",
        "",
        f"  per category, routed at the calibrated threshold {r.calibrated.threshold:.4f}:",
        f"  {'category':<20} {'n':>4} {'hard':>5} {'mean score':>11} {'large':>8}"
        f" {'misrouted':>10}",
    ]
    for row in r.categories:
        lines.append(
            f"  {row.category:<20} {row.n:>4} {row.n_hard:>5} {row.mean_score:>11.3f}"
            f" {_pct(row.large_share):>8} {row.misrouted:>10}"
        )
    lines += ["", "  highest-scoring easy prompts:"]
    lines += [f"    {s:.3f}  {i}" for i, s in r.worst_easy]
    lines += ["  lowest-scoring hard prompts:"]
    lines += [f"    {s:.3f}  {i}" for i, s in r.worst_hard]
    return "\n".join(lines) + "\n"


def write_roc_plot(result: TierEvalResult, path: str | Path) -> None:
    """The ROC curve with both operating points marked, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=120)
    fpr = [p[0] for p in result.roc]
    tpr = [p[1] for p in result.roc]
    ax.plot(fpr, tpr, drawstyle="default", label=f"classifier (AUC {result.auc:.3f})")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=0.8, label="chance")
    n_easy = result.n - result.n_hard
    for name, point, marker in (
        (f"calibrated, {result.target_large_share:.0%} large", result.calibrated, "o"),
        (f"fixed {FIXED_THRESHOLD}", result.fixed, "s"),
    ):
        ax.plot(
            point.easy_sent_large / n_easy,
            point.recall,
            marker=marker,
            linestyle="none",
            label=f"{name} (t={point.threshold:.3f})",
        )
    ax.set_xlabel("false positive rate (easy routed large)")
    ax.set_ylabel("true positive rate (hard routed large)")
    ax.set_title(f"Tier classifier ROC, {result.n} labelled prompts")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
