"""A CPU tier behind the simulated KV cache, as vLLM's CPU offloading (its OffloadingConnector,
``--kv-offloading-size``) keeps one: every block the engine computes is written to it, it
evicts its least recently used block when full, and the blocks of a prompt that the GPU cache
lost but the tier holds are loaded back rather than computed. Loaded tokens count among the
replica's prefix-cache hits (``vllm:prefix_cache_hits_total``) and its answers' cached tokens:
a fleet's hit rate is then the prompt tokens it did not compute.

Its KV-cache events are the connector's: ``BlockStored`` with medium "CPU" and no token ids
(a subscriber knows the blocks by their hashes from the GPU's events) for each block written,
``BlockRemoved`` with medium "CPU" for each evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from replica.sim.kv_events import block_removed, block_stored

MEDIUM = "CPU"


class OffloadTier:
    """Block hashes held in host memory, least recently used first."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self._held: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def loadable(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, it holds."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._held:
                break
            count += 1
        return count

    def touch(self, hashes: Sequence[int]) -> None:
        """A prompt used these blocks: the most recently used now, where held."""
        for block_hash in hashes:
            if block_hash in self._held:
                self._held.move_to_end(block_hash)

    def store(self, hashes: Sequence[int], events: list[dict[str, Any]] | None) -> None:
        """Computed blocks written through; the least recently used evicted past capacity."""
        written = [h for h in hashes if h not in self._held]
        for block_hash in hashes:
            self._held[block_hash] = None
            self._held.move_to_end(block_hash)
        evicted: list[int] = []
        while len(self._held) > self.capacity:
            evicted.append(self._held.popitem(last=False)[0])
        if events is not None:
            if written:
                events.append(block_stored(written, None, (), self.block_size, None, MEDIUM))
            if evicted:
                events.append(block_removed(evicted, MEDIUM))

    def clear(self) -> None:
        self._held.clear()
