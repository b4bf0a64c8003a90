"""Each instance's own counts as a flat hash, and the other instances' counts added to the
local view: in-flight requests and pending prefill per replica (what the cost model reads),
waiting requests per pool, and arrivals and completions per pool (monotonic counts, so the
autoscaling rates see the whole fleet)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.fleet.pools import Fleet

_SEP = "\x1f"
ARRIVALS, COMPLETIONS, WAITING, INFLIGHT = "a", "c", "w", "i"
PENDING, PENDING_TOKENS = "p", "t"
_PER_REPLICA = (INFLIGHT, PENDING, PENDING_TOKENS)


def own_figures(fleet: Fleet) -> dict[str, int]:
    """This instance's counts, as the hash fields other instances read."""
    out: dict[str, int] = {}
    for pool in fleet.pools.values():
        out[f"{ARRIVALS}{_SEP}{pool.name}"] = pool.counts.arrivals
        out[f"{COMPLETIONS}{_SEP}{pool.name}"] = pool.counts.completions
        out[f"{WAITING}{_SEP}{pool.name}"] = pool.gateway_waiting
        for replica in pool.replicas.values():
            key = f"{pool.name}{_SEP}{replica.name}"
            out[f"{INFLIGHT}{_SEP}{key}"] = replica.inflight
            out[f"{PENDING}{_SEP}{key}"] = replica.pending_requests
            out[f"{PENDING_TOKENS}{_SEP}{key}"] = round(replica.pending_prefill_tokens)
    return out


class RemoteFigures:
    """Sums the other instances' hashes into the fleet's remote fields.

    Arrivals and completions are counters that restart at 0 with their instance and vanish
    with it: the sum the fleet sees only ever grows by each instance's increase since the
    previous read, so a rate over it stays right when an instance comes or goes.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    def apply(self, fleet: Fleet, others: Mapping[str, Mapping[str, str | int]]) -> None:
        per_replica: dict[tuple[str, str, str], int] = {}
        waiting: dict[str, int] = {}
        grown: dict[tuple[str, str], int] = {}
        seen: dict[tuple[str, str], int] = {}
        for instance, fields in others.items():
            for field, raw in fields.items():
                kind, _, rest = field.partition(_SEP)
                try:
                    value = int(raw)
                except ValueError:
                    continue
                if kind in _PER_REPLICA:
                    pool_name, _, replica_name = rest.partition(_SEP)
                    key3 = (kind, pool_name, replica_name)
                    per_replica[key3] = per_replica.get(key3, 0) + value
                elif kind == WAITING:
                    waiting[rest] = waiting.get(rest, 0) + value
                elif kind in (ARRIVALS, COMPLETIONS):
                    key = (instance, f"{kind}{_SEP}{rest}")
                    before = self._last.get(key, 0)
                    step = value - before if value >= before else value
                    grown[(kind, rest)] = grown.get((kind, rest), 0) + step
                    seen[key] = value
        # Merged, not replaced: an instance missing from one read must not count again from 0.
        self._last.update(seen)
        for pool in fleet.pools.values():
            remote = pool.counts.remote
            remote.waiting = waiting.get(pool.name, 0)
            remote.arrivals += grown.get((ARRIVALS, pool.name), 0)
            remote.completions += grown.get((COMPLETIONS, pool.name), 0)
            for replica in pool.replicas.values():
                name = (pool.name, replica.name)
                replica.remote_inflight = per_replica.get((INFLIGHT, *name), 0)
                replica.remote_pending_requests = per_replica.get((PENDING, *name), 0)
                replica.remote_pending_prefill_tokens = per_replica.get((PENDING_TOKENS, *name), 0)

    @staticmethod
    def forget(fleet: Fleet) -> None:
        """The backend is away: route on this instance's own counts only."""
        for pool in fleet.pools.values():
            pool.counts.remote.waiting = 0
            for replica in pool.replicas.values():
                replica.remote_inflight = 0
                replica.remote_pending_requests = 0
                replica.remote_pending_prefill_tokens = 0.0
