"""Per-replica approximate prefix index: which prompt blocks a replica probably holds in KV cache.

It is what the gateway has sent there, not what the engine reports, bounded like the engine's
own cache so that it forgets roughly when the engine evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router_policies.block_layout import BlockLayout


class PrefixIndex:
    """A bounded LRU of chained block digests, its capacity counted in ``block_bytes`` units
    (a block further into a prompt is larger and weighs more).

    Blocks are touched from the last to the first, so a prefix is always at least as recent as
    anything that extends it: the index stays prefix-closed under eviction, which lets a lookup
    binary-search the chain instead of probing every block.
    """

    __slots__ = ("_blocks", "_layout", "_size", "capacity")

    def __init__(self, capacity: int, layout: BlockLayout) -> None:
        self.capacity = max(1, capacity)
        self._layout = layout
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def size(self) -> int:
        """Capacity used, in block_bytes units."""
        return self._size

    def match_length(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of `hashes` this replica holds."""
        blocks = self._blocks
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, hashes: Sequence[int]) -> None:
        blocks = self._blocks
        weight = self._layout.weight
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = w = weight(i)
                self._size += w
        self._evict()

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._evict()

    def _evict(self) -> None:
        blocks = self._blocks
        while self._size > self.capacity and blocks:
            self._size -= blocks.popitem(last=False)[1]

    def clear(self) -> None:
        self._blocks.clear()
        self._size = 0
