"""Each instance's own counts as a flat hash, and the other instances' counts added to the
local view: in-flight requests and pending prefill per replica (what the cost model reads),
waiting requests per pool, and arrivals and completions per pool (monotonic counts, so the
autoscaling rates see the whole fleet)."""

from __future__ import annotations

import math
import time
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


GAP_S = 1.0
"""Longest time between two reads over which the other instances' growth still counts as just
arrived (a read every 75 ms; a flapping backend's failed rounds, each a fraction of a second,
stay under it), or three sync intervals where those are longer. After a longer gap (the backend
away, this process stalled) it arrived at any time in it, perhaps before the autoscaling rate's
window: added at once it would read as a burst of arrivals, which the signal's stabiliser then
holds for minutes, so that read is a baseline."""


class RemoteFigures:
    """Sums the other instances' hashes into the fleet's remote fields.

    Arrivals and completions are counters that restart at 0 with their instance and vanish
    with it: the sum the fleet sees only ever grows by each instance's increase since the
    previous read, so a rate over it stays right when an instance comes or goes. An instance's
    first count is a baseline, not an increase (its total since it started did not arrive in the
    last read's interval), as is one after a gap: its first read after GAP_S, or its first after
    a read it was missing from (the reads leave out an instance silent for the state TTL).
    """

    def __init__(self, sync_interval_s: float) -> None:
        self._last: dict[str, dict[str, int]] = {}
        self._read_at = -math.inf
        self._gap_s = max(GAP_S, 3 * sync_interval_s)  # else every read would be a baseline

    def apply(
        self, fleet: Fleet, others: Mapping[str, Mapping[str, str | int]], now: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
        before_all = self._last if now - self._read_at <= self._gap_s else {}
        self._read_at, self._last = now, {}
        per_replica: dict[tuple[str, str, str], int] = {}
        waiting: dict[str, int] = {}
        grown: dict[tuple[str, str], int] = {}
        for instance, fields in others.items():
            seen = before_all.get(instance, {})
            last = self._last[instance] = {}
            for field, raw in fields.items():
                kind, _, rest = field.partition(_SEP)
                try:
                    value = int(raw)
                except (ValueError, TypeError):  # another version's, or broken: not a count
                    continue
                if kind in _PER_REPLICA:
                    pool_name, _, replica_name = rest.partition(_SEP)
                    key3 = (kind, pool_name, replica_name)
                    per_replica[key3] = per_replica.get(key3, 0) + value
                elif kind == WAITING:
                    waiting[rest] = waiting.get(rest, 0) + value
                elif kind in (ARRIVALS, COMPLETIONS):
                    before = seen.get(field)
                    # Fewer than before: it restarted, counting from 0.
                    step = 0 if before is None else value - before if value >= before else value
                    grown[(kind, rest)] = grown.get((kind, rest), 0) + step
                    last[field] = value
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
