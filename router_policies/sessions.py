"""Session affinity: a conversation the client names (a header, or OpenAI's `prompt_cache_key`
or `user` field) goes back to the replica its last request went to, while that replica is
healthy and not predicted slower than a cold start elsewhere.

Prefix matching keeps most conversations home without being told; a session key also holds
one whose prompts share little text (a client that rewrites or summarises its history, an
agent whose tool results change the start of the prompt), and names it the way the peers'
users ask for (llm-d's x-session-token, SGLang's X-SMG-Routing-Key).
"""

from __future__ import annotations

from collections import OrderedDict


class Sessions:
    """The replica each recent session last went to, least recently used forgotten first.
    Their number is bounded by the policy of the moment (``bind``'s ``capacity``), so that a
    reload refused after this pool's policy was built leaves the running bound as it was."""

    __slots__ = ("_homes",)

    def __init__(self) -> None:
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def home(self, session: str) -> str | None:
        return self._homes.get(session)

    def bind(self, session: str, replica: str, capacity: int) -> None:
        homes = self._homes
        homes[session] = replica
        homes.move_to_end(session)
        while len(homes) > capacity:
            homes.popitem(last=False)
