"""One PNG per scenario: replicas, queue depth and TTFT of every strategy."""

from __future__ import annotations

from pathlib import Path

from bench.scaling.config import ScalingConfig
from bench.scaling.report import describe
from bench.scaling.results import ScenarioOutcome

_COLORS = {"A": "tab:blue", "B": "tab:red", "C": "tab:purple", "P": "tab:green"}


def plot(outcome: ScenarioOutcome, path: Path, config: ScalingConfig) -> None:
    """One PNG: replicas per strategy (ready, scraped signal, HPA target, right value), then
    queue depth and TTFT p90 of every strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = outcome.outcomes
    rows = len(runs) + 2
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.3 * rows), sharex=True)
    event = outcome.scenario.event_s
    ceiling = config.settings.max_replicas * 1.08 + 1
    for ax, run in zip(axes, runs, strict=False):
        s = run.series
        ax.step(s.t, s.right, where="post", color="black", ls=":", lw=1.2, label="right value")
        ax.step(s.t, s.signal, where="post", color="tab:orange", lw=1.1, label="signal (scraped)")
        ax.step(s.t, s.hpa_target, where="post", color="tab:blue", lw=1.4, label="HPA target")
        ax.step(s.t, s.ready, where="post", color="tab:green", lw=2.0, label="ready")
        ax.set_ylim(0, min(max(*s.hpa_target, *s.right) * 1.2 + 1, ceiling))
        ax.set_ylabel("replicas")
        ax.set_title(
            f"{run.strategy.key}: {run.strategy.label}; HPA on {run.strategy.metric}",
            fontsize=10,
            loc="left",
        )
    queue_ax, ttft_ax = axes[-2], axes[-1]
    for run in runs:
        s, color = run.series, _COLORS[run.strategy.key]
        queue_ax.plot(s.t, s.queue_depth, color=color, lw=1.0, alpha=0.85, label=run.strategy.key)
        ttft_ax.plot(s.ttft_t, s.ttft_p90, color=color, lw=1.2, alpha=0.85, label=run.strategy.key)
    queue_ax.set_yscale("symlog", linthresh=10)
    queue_ax.set_ylabel("queue depth")
    queue_ax.set_title("requests waiting (gateway + engines)", fontsize=10, loc="left")
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("TTFT p90 (s)")
    ttft_ax.set_title(
        f"TTFT p90 of the requests served in the last {config.ttft_window_s:g} s",
        fontsize=10,
        loc="left",
    )
    ttft_ax.set_xlabel("time (s)")
    for ax in axes:
        ax.axvline(event, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, ncol=5)
    rate_ax = axes[0].twinx()
    rate_ax.plot(runs[0].series.t, runs[0].series.rate, color="grey", lw=0.8, alpha=0.5)
    rate_ax.set_ylabel("arrivals (req/s)", color="grey")
    rate_ax.set_ylim(0, None)
    fig.suptitle(
        f"{outcome.scenario.name}: {describe(outcome.scenario)}; cold start "
        f"{config.cold_start_s:g} s, scrape {config.scrape_interval_s:g} s, seed {config.seed}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
