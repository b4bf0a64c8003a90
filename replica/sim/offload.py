"""A CPU tier behind the simulated KV cache, as vLLM's CPU offloading (its OffloadingConnector,
``--kv-offloading-size``) keeps one: every block the engine computes is written to it, it
evicts its least recently used block when full, and the blocks of a prompt that the GPU cache
lost but the tier holds are loaded back rather than computed. Loaded tokens count, as vLLM
counts a KV connector's, among the replica's external prefix-cache hits
(``vllm:external_prefix_cache_hits_total``, not ``vllm:prefix_cache_hits_total``) and its
answers' cached tokens: the benchmarks' fleet hit rate adds the two, the prompt tokens the
fleet did not compute.

Its KV-cache events are the connector's: ``BlockStored`` with medium "CPU" and no token ids
(a subscriber knows the blocks by their hashes from the GPU's events) for each block written,
``BlockRemoved`` with medium "CPU" for each evicted.

A tier block may hold several of the cache's (the connector's ``block_size``, a multiple of
the engine's; vLLM's usage guide configures 64 against the GPU's 16): the cache's blocks are
grouped from a prompt's start, a group is written once all of it is computed and loaded only
whole, and it is named by the hash of its last block, as the connector names it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from replica.sim.kv_events import block_removed, block_stored

MEDIUM = "CPU"


class OffloadTier:
    """Tier blocks held in host memory, by the hash of their last cache block, least recently
    used first."""

    def __init__(self, capacity: int, block_size: int, factor: int = 1) -> None:
        self.factor = factor
        """Cache blocks per tier block."""
        self.capacity = capacity // factor
        """Tier blocks it holds: ``capacity`` cache blocks' worth."""
        self.block_size = block_size * factor
        self._held: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def _names(self, hashes: Sequence[int], start: int, end: int) -> Sequence[int]:
        """The tier blocks whose last cache block is one of ``start`` to ``end`` of a prompt's
        ``hashes``: those hashes."""
        last = start + (self.factor - 1 - start) % self.factor
        return hashes[last : end : self.factor]

    def loadable(self, hashes: Sequence[int], cached: int, usable: int) -> int:
        """Cache blocks past the ``cached`` first that whole tier blocks it holds cover, within
        the first ``usable`` of a prompt's ``hashes``."""
        start = cached - cached % self.factor  # the group the cached blocks end in
        held = 0
        for name in self._names(hashes, start, usable):
            if name not in self._held:
                break
            held += 1
        return max(start + held * self.factor - cached, 0)

    def touch(self, hashes: Sequence[int], blocks: int) -> None:
        """A prompt used its first ``blocks``: the tier blocks among them the most recently used
        now, where held."""
        for name in self._names(hashes, 0, blocks):
            if name in self._held:
                self._held.move_to_end(name)

    def store(
        self, hashes: Sequence[int], first: int, done: int, events: list[dict[str, Any]] | None
    ) -> None:
        """A prompt's blocks ``first`` to ``done`` computed: the tier blocks they complete
        written through; the least recently used evicted past capacity."""
        names = self._names(hashes, first, done)
        written = [h for h in names if h not in self._held]
        for block_hash in names:
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
