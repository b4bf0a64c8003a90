"""Tiers kept per conversation: once a conversation has gone to the large pool, its later turns
go there too. A follow-up ("can you make it shorter?", "and the second case?") read alone
looks easy; the task it continues is not, and a switch to the small model midway loses both
the quality the task needed and the large pool's cache of the conversation. An upgrade is
always allowed: a conversation that turns hard goes large from that turn on.

A conversation is known by what each of its turns resends first: its messages so far. A
request that goes large is remembered by all of its messages (their digest, chained message
by message from the system and developer messages through the last), and a follow-up is
looked up by the digest of its messages through each one from its first user message (its
opening) on: the request it continues is one of those. Two people who open alike ("hi" under
one system prompt), even answered alike (a greedy model's greeting), differ by what they ask
next, so one's later turns never keep the other's large. One that went large on its first
turn is known by its opening alone (nothing else was written yet): another that opens alike
scored the same on its first turn. Only a follow-up is looked up: a first turn continues
nothing. Remembered per tier model and per process, the least recently used forgotten first;
processes that share state tell each other (the worker mesh, or Redis: gateway/shared_state/).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson
import xxhash

from router_policies.conversation import chat_messages
from router_policies.fingerprint import content_bytes, normal_calls


def conversation_keys(body: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The keys a chat or /v1/responses request's conversation is known by (the same on either
    API): the digest of its messages through its opening (its first user message), then
    through each message after it; None for a request with no user message (or neither). It
    is remembered under the last, the whole request, and a follow-up is looked up under each.
    The opening's key is that of earlier releases, which other instances may still share."""
    messages = chat_messages(body)
    if messages is None:
        return None
    digest = xxhash.xxh3_64()
    keys: list[int] = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role = message.get("role")
        digest.update(f"{role}\0".encode("utf-8", "surrogatepass"))
        # Read as prefix routing reads it (router_policies/fingerprint.py): a string, or its
        # text parts' text, so one text part (or /v1/responses input_text) is the same
        # conversation as the plain string. The tag "s" keeps the keys of string content
        # those of earlier releases.
        digest.update(b"s")
        digest.update(content_bytes(message.get("content")))
        tool_calls = message.get("tool_calls")
        if tool_calls:  # an answer that only calls tools differs by its calls
            digest.update(
                b"\x1e" + orjson.dumps(normal_calls(tool_calls), option=orjson.OPT_SORT_KEYS)
            )
        digest.update(b"\x1e")
        if keys or role == "user":
            keys.append(digest.intdigest())
    return tuple(keys) or None


def continues(keys: tuple[int, ...] | None) -> TypeGuard[tuple[int, ...]]:
    """Whether a request with these ``conversation_keys`` continues a conversation: a message
    follows its first user message (an answer, a tool's call or result, another user turn).
    Only those can have gone large before."""
    return keys is not None and len(keys) > 1


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

    def any_went_large(self, keys: tuple[int, ...]) -> bool:
        """Whether a follow-up's conversation went large, under any of its keys
        (``conversation_keys``); a first turn's never did, whatever its opening did."""
        return self.remembered_key(keys) is not None

    def remembered_key(self, keys: tuple[int, ...]) -> int | None:
        """The key a follow-up's conversation is remembered under as large, if it is."""
        if continues(keys):
            for key in keys:
                if self.went_large(key):
                    return key
        return None

    def remember(self, key: int, capacity: int) -> None:
        self._large[key] = None
        self._large.move_to_end(key)
        while len(self._large) > capacity:
            self._large.popitem(last=False)
