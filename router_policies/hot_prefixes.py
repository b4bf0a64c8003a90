"""Which prefixes are hot: each prefix group's recent share of a pool's traffic.

A prefix whose share is more than a fair share of one replica is spread over the first k
replicas of its own rendezvous order, k following the share up and down, so the hottest
system prompt lives warm on k replicas instead of overloading one (or going cold everywhere).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from router_policies.decay import DecayedCount


class HotPrefixes:
    """Decayed request counts per prefix key (bounded LRU) and for the whole pool."""

    def __init__(self, half_life_s: float, max_keys: int = 4096) -> None:
        self.half_life_s = half_life_s
        self._max_keys = max_keys
        self._counts: OrderedDict[int, DecayedCount] = OrderedDict()
        self._total = DecayedCount(half_life_s)

    def record(self, key: int, now: float) -> None:
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = DecayedCount(self.half_life_s)
            if len(self._counts) > self._max_keys:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(key)
        count.add(now)
        self._total.add(now)

    def share(self, key: int, now: float, min_total: float = 1.0) -> float:
        """The key's share of the pool's recent requests (0 for a key not seen lately), taken
        over at least ``min_total`` requests so that a young pool's few keys are not each
        mistaken for most of its traffic."""
        count = self._counts.get(key)
        if count is None:
            return 0.0
        return min(count.value(now) / max(self._total.value(now), min_total), 1.0)


def spread(share: float, replicas: int, factor: float) -> int:
    """Replicas a prefix with this share of traffic should be warm on: enough that none of them
    takes more than 1/factor of a fair share (1/replicas) from this prefix alone."""
    if replicas <= 1:
        return 1
    # Capped before rounding: a large factor makes the product inf, which no int can hold.
    return max(1, math.ceil(min(share * replicas * factor, replicas) - 1e-9))
