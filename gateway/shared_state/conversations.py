"""The conversations a tier model sent large, between instances: one Redis key each, with a TTL
(the workers of one instance without Redis push them over the mesh instead).

A conversation keeps its tier (router_policies/tier_memory.py): once it has gone large, its
later turns go large too. Each instance remembers that for the conversations it served; behind
a load balancer a conversation's next turn may reach another instance, which would read the
follow-up alone and send it small. So an instance that sends a conversation large writes its
key to Redis (not waited for), and one asked for a follow-up turn of a conversation it does not
know as large looks for the key before scoring it: one GET per such turn, none for a first turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

REDIS_TTL_S = 86_400
"""How long Redis keeps a conversation's tier: a conversation resumed within a day keeps it,
and a busy fleet's keys stay bounded (~80 bytes each)."""
_FAILURES = (RedisError, OSError, TimeoutError)


class RedisConversations:
    """Writes and reads the keys, through the backend's client, while its link is up."""

    def __init__(
        self,
        client: aioredis.Redis,
        key_prefix: str,
        link_up: Callable[[], bool],
        writes: set[asyncio.Task[None]],
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._up = link_up
        self._writes = writes

    def _key(self, model: str, conversation: int) -> str:
        return f"{self._prefix}:large:{model}:{conversation:x}"

    def publish(self, model: str, conversation: int) -> None:
        if not self._up():
            return  # soft state: with Redis away, only this instance knows it
        task = asyncio.create_task(self._write(self._key(model, conversation)))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, key: str) -> None:
        with contextlib.suppress(*_FAILURES):
            await self._client.set(key, b"1", ex=REDIS_TTL_S)

    async def fetch(self, model: str, conversation: int) -> bool:
        if not self._up():
            return False
        try:
            return bool(await self._client.exists(self._key(model, conversation)))
        except _FAILURES:
            return False
