"""Stored responses' homes between processes: one small message per response stored.

vLLM keeps a stored response on the replica that made it, and a client's next call (a
``previous_response_id`` follow-up, a GET, a cancel) may reach any worker or instance, so
each home the gateway learns is sent to the others: over the worker mesh at once, to Redis as
one key with a TTL. A process asked for an id it does not know asks the backend before
answering that it does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from gateway.routing.affinity import ReplicaRef, ResponseHomes

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

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


KEEP_OWNER = """
local known = redis.call('GET', KEYS[1])
if known then
  local ok, home = pcall(cjson.decode, known)
  if not ok or type(home) ~= 'table' or home[4] ~= cjson.decode(ARGV[1])[4] then
    return known
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"""
"""Writes a home unless the key holds the id under another owner (or in a shape this version
cannot read): then it answers what the key holds. One script, so that two instances learning
the same id at once cannot both win. cjson decodes a null owner to one shared value, so two
nulls compare equal."""


async def claim(
    keep_owner: AsyncScript, key: str, response_id: str, home: ReplicaRef, homes: ResponseHomes
) -> None:
    """Shares a home learned here through Redis; an id Redis knew first under another owner
    keeps that owner, here too (see `ResponseHomes.learn`: an id never changes owner)."""
    kept = await keep_owner(keys=[key], args=[encode(response_id, home), REDIS_TTL_S])
    if isinstance(kept, bytes):  # decode_responses=False: bytes, whatever the stubs say
        first = decode(kept)
        homes.overrule(response_id, first[1] if first and first[0] == response_id else None)
