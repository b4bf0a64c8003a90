"""Per-replica approximate prefix index: which prompt blocks a replica probably holds in KV cache.

It is what the gateway has sent there, not what the engine reports, bounded like the engine's
own cache so that it forgets roughly when the engine evicts.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from router_policies.block_layout import BlockLayout

_VERSIONS = itertools.count(1)
"""Every change of any index takes the next number: a record names the state it left."""


@dataclass(slots=True)
class Recorded:
    """What recording one prompt changed in a replica's index, kept until its answer: a
    replica that refuses the prompt with a 4xx (past its context, a bad parameter) stored none
    of it, and the record is taken back (``PrefixIndex.take_back``)."""

    held_blocks: int
    """Its leading blocks the index held already; it added the rest."""
    evicted: list[tuple[int, int, int]] = field(default_factory=list)
    """What adding them evicted, oldest first: (digest, weight, lead bytes)."""
    version: int = 0
    """The index's version the record left."""


class PrefixIndex:
    """A bounded LRU of chained block digests, its capacity counted in ``block_bytes`` units
    (a block further into a prompt is larger and weighs more).

    Blocks are touched from the last to the first, so a prefix is always at least as recent as
    anything that extends it: the index stays prefix-closed under eviction, which lets a lookup
    binary-search the chain instead of probing every block.
    """

    __slots__ = ("_blocks", "_layout", "_lead_bytes", "_leads", "_size", "capacity", "version")

    def __init__(self, capacity: int, layout: BlockLayout) -> None:
        self.capacity = max(1, capacity)
        self._layout = layout
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._size = 0
        self._leads: dict[int, int] = {}
        self._lead_bytes = 0
        self.version = next(_VERSIONS)
        """Changes with every insert, resize and clear."""

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

    def insert(
        self, hashes: Sequence[int], evicted: list[tuple[int, int, int]] | None = None
    ) -> int:
        """Records a prompt sent here; returns the capacity its new blocks take (what the
        engine had to prefill and store, evicting as much of something else). ``evicted``
        collects what made room for them."""
        blocks = self._blocks
        weight = self._layout.weight
        added = 0
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = w = weight(i)
                added += w
        self._size += added
        self._evict(evicted)
        self.version = next(_VERSIONS)
        return added

    def take_back(self, hashes: Sequence[int], recorded: Recorded) -> int:
        """Undoes the record of a prompt the engine refused: the blocks it added go and those
        it evicted come back, in their place as the least recent. Only while nothing else has
        changed the index (a refusal comes back within milliseconds): a prompt recorded since
        may share the blocks the refused one added, and the engine holds its. Returns the
        capacity taken back."""
        if recorded.version != self.version:
            return 0
        blocks, leads = self._blocks, self._leads
        added = set(hashes[recorded.held_blocks :])
        taken = 0
        for h in added:
            weight = blocks.pop(h, None)
            if weight is not None:
                taken += weight
                self._lead_bytes -= leads.pop(h, 0)
        self._size -= taken
        for digest, weight, lead in reversed(recorded.evicted):
            if digest in added:  # its own deepest blocks, evicted by the rest of it
                taken += weight
                continue
            blocks[digest] = weight
            blocks.move_to_end(digest, last=False)
            self._size += weight
            if lead:
                leads[digest] = lead
                self._lead_bytes += lead
        self.version = next(_VERSIONS)
        return taken

    def note_lead(self, home_block: int, lead_bytes: int) -> None:
        """Records a shared lead (a system prompt) just inserted, named by its home block."""
        if home_block in self._blocks:
            self._lead_bytes += lead_bytes - self._leads.get(home_block, 0)
            self._leads[home_block] = lead_bytes

    @property
    def lead_bytes(self) -> int:
        """Bytes of the shared leads this replica still holds (their home block not evicted):
        the cache room its prefixes take, as against one-off text."""
        return self._lead_bytes

    def resize(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._evict()
        self.version = next(_VERSIONS)

    def _evict(self, into: list[tuple[int, int, int]] | None = None) -> None:
        blocks = self._blocks
        leads = self._leads
        while self._size > self.capacity and blocks:
            digest, weight = blocks.popitem(last=False)
            self._size -= weight
            lead = leads.pop(digest, 0) if leads else 0
            self._lead_bytes -= lead
            if into is not None:
                into.append((digest, weight, lead))

    def clear(self) -> None:
        self.version = next(_VERSIONS)
        self._blocks.clear()
        self._leads.clear()
        self._lead_bytes = 0
        self._size = 0
