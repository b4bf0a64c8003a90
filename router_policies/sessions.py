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

from router_policies.hot_prefixes import HotPrefixes


class Sessions:
    """The replica each recent session last went to, least recently used forgotten first.
    Their number is bounded by the policy of the moment (``bind``'s ``capacity``), so that a
    reload refused after this pool's policy was built leaves the running bound as it was.
    Also each session's recent share of the pool's requests (``half_life_s``)."""

    __slots__ = ("_homes", "_traffic")

    def __init__(self, half_life_s: float) -> None:
        self._homes: OrderedDict[str, str] = OrderedDict()
        self._traffic = HotPrefixes(half_life_s)

    def count(self, session: str, now: float) -> None:
        """One more of the pool's requests, under its session ("": none)."""
        self._traffic.record(hash(session) if session else 0, now)

    def shared(self, session: str, now: float, min_requests: float, replicas: int) -> bool:
        """Whether the key takes more than one replica's fair share of the pool's recent
        requests (over ``min_requests`` at least): an app's one `prompt_cache_key` or `user`
        for all of its traffic, not a conversation, whose turns come one at a time. Pinned, it
        piled onto one replica (a cold start elsewhere looked slower until the home's batch was
        full); routed as any request, its prefix spreads as a hot one."""
        return self._traffic.share(hash(session), now, min_requests) * replicas > 1

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
