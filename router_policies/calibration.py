"""Online threshold calibration: send a target share of recent traffic to the large pool.

RouteLLM calibrates its threshold offline, as a quantile of a traffic sample; here the sample is
a sliding window of the scores actually seen, so the share holds as traffic drifts.
"""

from __future__ import annotations

import bisect
import copy
from collections import deque


class QuantileThreshold:
    def __init__(self, target_share: float, window: int, min_samples: int, initial: float) -> None:
        self.target_share = target_share
        self.min_samples = min_samples
        self._initial = initial
        self._recent: deque[float] = deque(maxlen=window)
        self._sorted: list[float] = []

    def with_initial(self, initial: float) -> QuantileThreshold:
        """The same window under another fixed threshold (a reloaded policy's): the window is
        shared, not copied, so a request still finishing under the old policy counts in the
        new one's window, and a reload that is refused leaves the old threshold as it was."""
        twin = copy.copy(self)  # shallow: the deque and the sorted list are the same objects
        twin._initial = initial
        return twin

    def observe(self, score: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._recent.append(score)
        bisect.insort(self._sorted, score)

    @property
    def samples(self) -> int:
        return len(self._sorted)

    @property
    def threshold(self) -> float:
        """Scores above this go large; the fixed initial value until the window fills."""
        n = len(self._sorted)
        if n < self.min_samples:
            return self._initial
        if self.target_share <= 0:
            return float("inf")
        if self.target_share >= 1:
            return float("-inf")
        # The score with target_share x n scores above it.
        rank = min(n - 1, max(0, round(n * (1 - self.target_share)) - 1))
        return self._sorted[rank]
