"""How far to believe the prefix index: the share of what it says a replica holds that the
replica really still held, from the cached-token counts the replica reports.

The index records what the gateway sent where; the engine evicts on its own schedule (other
gateways' traffic, longer outputs, another tokenizer's density). When requests the index
expected to hit come back with fewer cached tokens, the belief falls and the index is sized
down in proportion, dropping its least recently used blocks, which are those the engine
evicted first; when hits come back as expected, it recovers.
"""

from __future__ import annotations

_MIN_EXPECTED_TOKENS = 32.0
"""Below this, the index expected nothing worth judging it by."""
_TOLERANCE = 0.9
"""Engines count cached tokens in whole KV blocks, and the gateway's token estimate is
approximate: a hit within 10% of the expectation counts as a full one."""


class IndexBelief:
    __slots__ = ("floor", "value", "weight")

    def __init__(self, weight: float = 0.1, floor: float = 0.1) -> None:
        self.weight = weight
        self.floor = floor
        self.value = 1.0

    def observe(self, expected_cached: float, cached: float) -> None:
        if expected_cached < _MIN_EXPECTED_TOKENS:
            return
        held = min(1.0, cached / (_TOLERANCE * expected_cached))
        self.value = max(self.floor, self.value + self.weight * (held - self.value))
