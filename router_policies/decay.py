"""Exponentially decayed counts: "how much lately", with a half-life instead of a window."""

from __future__ import annotations

import math


class DecayedCount:
    """A count whose past contributions halve every ``half_life_s`` seconds.

    O(1) in memory and time, and smooth: a burst raises it at once but a passing burst fades,
    which a sliding window's hard edge does not do.
    """

    __slots__ = ("_at", "_rate", "_value")

    def __init__(self, half_life_s: float) -> None:
        self._rate = math.log(2) / half_life_s
        self._value = 0.0
        self._at = 0.0

    def retune(self, half_life_s: float, now: float) -> None:
        """Another half-life from ``now`` on: the count so far decays at the old one until then."""
        self._value, self._at = self.value(now), max(now, self._at)
        self._rate = math.log(2) / half_life_s

    def value(self, now: float) -> float:
        if now <= self._at:
            return self._value
        return self._value * math.exp(-self._rate * (now - self._at))

    def add(self, now: float, amount: float = 1.0) -> None:
        self._value = self.value(now) + amount
        self._at = max(now, self._at)
