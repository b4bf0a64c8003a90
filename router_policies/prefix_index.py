"""Per-replica approximate prefix index: which prompt blocks a replica probably holds in KV cache.

It is what the gateway has sent there, not what the engine reports, bounded like the engine's
own cache so that it forgets roughly when the engine evicts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """A bounded LRU of chained block digests.

    Blocks are touched from the last to the first, so a prefix is always at least as recent as
    anything that extends it: the index stays prefix-closed under eviction, which lets a lookup
    binary-search the chain instead of probing every block.
    """

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

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
        for h in reversed(hashes):
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
