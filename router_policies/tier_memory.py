"""Tiers kept per conversation: once a conversation has gone to the large pool, its later turns
go there too. A follow-up ("can you make it shorter?", "and the second case?") read alone
looks easy; the task it continues is not, and a switch to the small model midway loses both
the quality the task needed and the large pool's cache of the conversation. An upgrade is
always allowed: a conversation that turns hard goes large from that turn on.

A conversation is known by what each of its turns resends first: its system and developer
messages and its first user message. Remembered per tier model and per process, the least
recently used forgotten first; processes that share state tell each other (the worker mesh,
or Redis: gateway/shared_state/).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import xxhash

from router_policies.conversation import chat_messages
from router_policies.fingerprint import content_bytes


def conversation_key(body: Mapping[str, Any]) -> int | None:
    """The conversation a chat or /v1/responses request continues (the same key on either
    API); None for a request with no user message (or neither)."""
    messages = chat_messages(body)
    if messages is None:
        return None
    digest = xxhash.xxh3_64()
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role = message.get("role")
        digest.update(f"{role}\0".encode("utf-8", "surrogatepass"))
        # Read as prefix routing reads it (router_policies/fingerprint.py): a string, or its
        # text parts' text, so one text part (or /v1/responses input_text) is the same
        # conversation as the plain string. The tag "s" keeps the keys of string content
        # those of earlier releases, which other instances may still share through Redis.
        digest.update(b"s")
        digest.update(content_bytes(message.get("content")))
        digest.update(b"\x1e")
        if role == "user":
            return digest.intdigest()
    return None


def follow_up(body: Mapping[str, Any]) -> bool:
    """Whether a chat or /v1/responses request continues a conversation (a second user turn
    or later): only those can have gone large before."""
    messages = chat_messages(body)
    if messages is None:
        return False
    users = 0
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            users += 1
            if users == 2:
                return True
    return False


class ConversationTiers:
    """The conversations that went large, most recently used last. Their number is bounded by
    the tier settings of the moment (``remember``'s ``capacity``), so that a reload which
    fails leaves the running bound as it was."""

    def __init__(self) -> None:
        self._large: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._large)

    def went_large(self, key: int) -> bool:
        if key not in self._large:
            return False
        self._large.move_to_end(key)
        return True

    def remember(self, key: int, capacity: int) -> None:
        self._large[key] = None
        self._large.move_to_end(key)
        while len(self._large) > capacity:
            self._large.popitem(last=False)
