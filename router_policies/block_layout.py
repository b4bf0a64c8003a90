"""Where the fingerprint's blocks begin and end: fine at the start, doubling further on.

Hashing the whole prompt in fixed 128-byte blocks costs one digest call per block: ~90 us for an
8k-token prompt in Python, most of a routing decision's budget. The block size instead doubles
after every ``doubling`` blocks, so a 32 KB prompt is 65 blocks and a 220 KB one 108, while a
match is still located to within 1/``doubling`` of its length: where a prompt's shared lead
ends (the first few KB) blocks are small, and a long conversation's history is known to within a
few percent, which is all the cost model needs of it.
"""

from __future__ import annotations

from router_policies.value import value


@value
class BlockLayout:
    block_bytes: int
    """Size of the first blocks, and the unit in which an index counts its capacity."""
    doubling: int = 0
    """The block size doubles after every this many blocks; 0: every block is block_bytes."""

    def weight(self, index: int) -> int:
        """Size of block ``index``, in units of block_bytes."""
        return 1 << (index // self.doubling) if self.doubling else 1

    def end(self, blocks: int) -> int:
        """Bytes covered by the first ``blocks`` blocks."""
        if not self.doubling:
            return blocks * self.block_bytes
        tier, rest = divmod(blocks, self.doubling)
        return self.block_bytes * (self.doubling * ((1 << tier) - 1) + (rest << tier))

    def blocks_within(self, size: int) -> int:
        """Number of whole blocks in the first ``size`` bytes."""
        if not self.doubling:
            return size // self.block_bytes
        units, tier = size // self.block_bytes, 0
        while units >= self.doubling << tier:
            units -= self.doubling << tier
            tier += 1
        return self.doubling * tier + (units >> tier)

    def floor(self, size: int) -> int:
        """``size`` rounded down to a block boundary."""
        return self.end(self.blocks_within(size))
