"""Stored responses' homes between processes: one small message per response stored.

vLLM keeps a stored response on the replica that made it, and a client's next call (a
``previous_response_id`` follow-up, a GET, a cancel) may reach any worker or instance, so
each home the gateway learns is sent to the others: over the worker mesh at once, to Redis as
one key with a TTL. A process asked for an id it does not know asks the backend before
answering that it does not exist.
"""

from __future__ import annotations

import orjson

from gateway.routing.affinity import ReplicaRef

REDIS_TTL_S = 86_400
"""How long Redis keeps a home: vLLM keeps stored responses until it restarts, and a day
bounds the keys a busy fleet leaves behind (~150 bytes each)."""
MESH_WAIT_S = 0.25
"""How long a worker waits for a home a sibling may be sending right now: a client can ask
for a response within a millisecond of reading it, through another worker."""
REDIS_RETRY_S = 0.05
"""Likewise through Redis: one more look this much later (the storing instance writes the key
as it relays the answer, not before)."""
MAX_ID_CHARS = 256
"""Longer ids are not vLLM's (``resp_`` and a uuid): not looked up."""


def encode(response_id: str, home: ReplicaRef) -> bytes:
    return orjson.dumps([response_id, home.pool, home.replica, home.owner])


def decode(payload: bytes) -> tuple[str, ReplicaRef] | None:
    """The id and home, or None for a payload that is not one (another version's shape)."""
    try:
        response_id, pool, replica, owner = orjson.loads(payload)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if not all(isinstance(v, str) for v in (response_id, pool, replica)):
        return None
    if owner is not None and not isinstance(owner, str):
        return None
    return response_id, ReplicaRef(pool, replica, owner)
