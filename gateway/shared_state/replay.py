"""Dispatches as one message for the other instances, and that message replayed into the
fleet: the same bytes whichever transport carries them (a Redis stream entry, a datagram
between workers)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import Histogram

from gateway.shared_state import codec
from gateway.shared_state.outbox import Sent

if TYPE_CHECKING:
    from gateway.fleet.pools import Fleet
    from gateway.routing.affinity import AdapterHomes

log = logging.getLogger(__name__)
_SKIPPED: list[bool] = []
"""Whether a record was skipped yet (a list: no global statement)."""

MAX_AGE_S = 60.0
"""A dispatch older than this when it arrives (kept through an outage) is not replayed."""


def encode_batch(batch: Sequence[Sent]) -> bytes:
    return orjson.dumps(
        {
            "f": codec.FIELDS,
            "d": [[t, pool, rep, codec.encode(feat)] for t, pool, rep, feat in batch],
        }
    )


def apply_batch(
    fleet: Fleet, raw: bytes | memoryview, lag: Histogram, adapters: AdapterHomes | None = None
) -> None:
    """Replays another instance's dispatches into this fleet's pools (the selection policy's
    record and the replica's recent-dispatch count) and, for a LoRA adapter's request, into
    ``adapters`` (which replicas have it loaded); what cannot be read is skipped."""
    try:
        batch: dict[str, Any] = orjson.loads(raw)
        names = list(batch["f"])
        records = batch["d"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return
    wall = time.time()
    now = time.monotonic()
    for record in records:
        try:
            _apply(fleet, names, record, lag, adapters, wall, now)
        except Exception:  # another version's record, or a broken one: skipped, not the
            # end of the replay (nor of the reader that runs it); said once per process
            if not _SKIPPED:
                _SKIPPED.append(True)
                log.warning("skipped a shared dispatch that cannot be replayed", exc_info=True)


def _apply(
    fleet: Fleet,
    names: list[str],
    record: Any,
    lag: Histogram,
    adapters: AdapterHomes | None,
    wall: float,
    now: float,
) -> None:
    sent_at, pool_name, replica, values = record
    age = max(wall - float(sent_at), 0.0)
    lag.observe(age)
    if age > MAX_AGE_S:
        return
    pool = fleet.pools.get(pool_name)
    features = codec.decode(names, values)
    if pool is None or features is None:
        return
    pool.apply_remote_dispatch(replica, features, now - age)
    if adapters is not None and features.model != pool.model:
        # An adapter's request is fingerprinted under the adapter's name.
        adapters.served(pool_name, features.model, replica, now - age)
