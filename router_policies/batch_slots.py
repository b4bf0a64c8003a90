"""How many sequences a replica's engine runs at once, inferred from its scraped queue.

An engine queues a request when its batch is full (or its KV cache is), but also for the moment
between the request's arrival and the engine's next scheduling step: a scrape that catches such
a passing queue beside one running sequence would call a 256-seat engine a one-seat one, and the
cost model would then predict a slot wait there and starve it. So a batch counts as full only
when the queue outlasts a scrape interval while the batch did not grow, and the engine is never
believed smaller than the most sequences it has been seen running.
"""

from __future__ import annotations

import math


class BatchSlots:
    __slots__ = ("_last_running", "_last_waiting", "_most_running", "value")

    def __init__(self) -> None:
        self.value = math.inf
        """Sequences the engine runs at once (unknown: unbounded)."""
        self._last_running = 0.0
        self._last_waiting = 0.0
        self._most_running = 0.0
        """The most sequences it has been seen running, before a full batch was seen too."""

    def observe(self, running: float, waiting: float) -> None:
        self._most_running = max(self._most_running, running)
        if math.isfinite(self.value) and running > self.value:
            self.value = running
        queue_stayed = waiting > 0 and self._last_waiting > 0
        if queue_stayed and 0 < running <= self._last_running:
            self.value = max(running, self._most_running)
        self._last_running = running
        self._last_waiting = waiting
