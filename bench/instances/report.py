"""The instances benchmark's table: each layout against one instance measured in the same run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.instances.runner import Lag, Layout, Row


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.3f}x"


def _diff(value: float | None, base: float | None) -> str:
    if value is None or base is None:
        return "-"
    return f"{value - base:+.2f}"


@dataclass(frozen=True, slots=True)
class Figures:
    """One layout on one workload, over every seed it ran: hits over queries, and the mean of
    each seed's max/mean of the requests per replica (as ``bench compare`` reads its seeds).
    Not max/mean of requests summed over seeds: each seed places its groups anew, so one
    seed's busiest replica can be another's quietest and their sum look even."""

    hit_rate: float | None
    balance: float | None
    failed: int
    sent: int
    mean_ttft_ms: float
    seeds: int


def combine(rows: Sequence[Row]) -> Figures:
    measurements = [r.measurement for r in rows]
    queries = sum(m.cache_queries for m in measurements)
    balances = [m.balance for m in measurements if m.balance is not None]
    ttfts = [t for m in measurements for t in m.ttfts]
    return Figures(
        sum(m.cache_hits for m in measurements) / queries if queries else None,
        sum(balances) / len(balances) if balances else None,
        sum(m.errors for m in measurements),
        sum(m.sent for m in measurements),
        1000 * sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        len(measurements),
    )


def markdown(rows: Sequence[Row], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        "| workload | seeds | gateways | hit rate | vs 1 instance | max/mean load | vs 1 instance "
        "| failed | mean TTFT ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, Layout], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.workload, row.layout), []).append(row)
    figures = {key: combine(group) for key, group in groups.items()}
    for (workload, layout), f in figures.items():
        one = figures.get((workload, Layout(1, False)))
        lines.append(
            f"| {workload} | {f.seeds} | {layout.label} "
            f"| {'-' if f.hit_rate is None else f'{f.hit_rate:.3f}'} "
            f"| {_ratio(f.hit_rate, one.hit_rate if one else None)} "
            f"| {'-' if f.balance is None else f'{f.balance:.2f}'} "
            f"| {_diff(f.balance, one.balance if one else None)} "
            f"| {f.failed}/{f.sent} | {f.mean_ttft_ms:.0f} |"
        )
    lags: dict[str, list[Lag]] = {}
    for row in rows:
        if row.lag is not None and row.layout.sharing is not None:
            lags.setdefault(row.layout.sharing, []).append(row.lag)
    for sharing, measured in lags.items():
        lines += ["", _lag_line(sharing, measured)]
    return "\n".join(lines) + "\n"


def _lag_line(sharing: str, lags: Sequence[Lag]) -> str:
    count = sum(lag.count for lag in lags)
    mean = sum(lag.mean_s * lag.count for lag in lags) / count if count else float("nan")
    p50 = max(lag.p50_s for lag in lags)
    p99 = max(lag.p99_s for lag in lags)
    return (
        f"Staleness {sharing} (dispatch on one gateway process to its replay on another, "
        f"gateway_state_apply_lag_seconds over {count:,} replays): mean {mean * 1000:.1f} ms, "
        f"p50 <= {p50 * 1000:g} ms, p99 <= {p99 * 1000:g} ms (histogram bucket bounds)."
    )
