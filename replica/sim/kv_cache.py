"""A block-level prefix cache with the semantics of vLLM's automatic prefix caching.

A prompt is cut into blocks of ``block_size`` tokens. Only FULL blocks can be shared, and a
block is identified by a hash chained through every block before it, so a hit on block i
implies the whole prefix up to i matches. Blocks used by running requests are pinned by a
reference count; blocks freed by finished requests keep their contents and stay findable
until an allocation needs the space, then the least recently used one is evicted. With a CPU
tier (replica/sim/offload.py) behind it, a prompt's blocks past its cached ones that the tier
holds are loaded back: they count as cached tokens, as vLLM's usage counts them. A request's
``cache_salt`` seeds its first block (vLLM mixes it into that block's hash), so requests with
different salts, or a salted and an unsalted one, never share a block.
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from replica.sim.kv_events import ALL_BLOCKS_CLEARED, block_removed, block_stored
from replica.sim.offload import OffloadTier
from replica.sim.tokenizer import token_bytes

_TOKEN_WIDTH = 8  # bytes per token id in token_bytes()


def block_hashes(
    tokens: Sequence[int], block_size: int, salt: int = 0, cache_salt: str | None = None
) -> list[int]:
    """Chained hashes of the full blocks of ``tokens``: block i is seeded by block i-1, the
    first by ``salt`` (a LoRA adapter's: vLLM never shares KV blocks across adapters) and the
    request's ``cache_salt``."""
    data = memoryview(token_bytes(tokens))
    stride = block_size * _TOKEN_WIDTH
    hashes: list[int] = []
    # Hashed rather than XORed in, so that no salt can cancel an adapter's out.
    parent = xxhash.xxh3_64_intdigest(cache_salt.encode(), seed=salt) if cache_salt else salt
    for start in range(0, (len(tokens) // block_size) * stride, stride):
        parent = xxhash.xxh3_64_intdigest(data[start : start + stride], seed=parent)
        hashes.append(parent)
    return hashes


@dataclass(eq=False)
class Allocation:
    """The blocks held by one request, first the prompt's (in order), then room to decode."""

    block_ids: list[int]
    prompt_hashes: list[int]  # hashes of the prompt's full blocks
    num_hit_blocks: int
    num_cached_tokens: int
    num_committed_blocks: int = 0
    freed: bool = field(default=False)
    tokens: Sequence[int] = ()
    """The prompt (kept only while KV events are on: a stored block's event carries them)."""
    lora_name: str | None = None
    cache_salt: str | None = None
    loaded_tokens: int = 0
    """Of ``num_cached_tokens``, those loaded back from the CPU tier."""


def _extra_keys(allocation: Allocation, block: int) -> tuple[str, ...] | None:
    """What a block's hash mixed in besides its tokens, as vLLM's events list it: the adapter's
    name on every block, the cache salt on the first only (it seeds the whole chain)."""
    keys = [allocation.lora_name] if allocation.lora_name else []
    if block == 0 and allocation.cache_salt:
        keys.append(allocation.cache_salt)
    return tuple(keys) or None


class KVCache:
    """A fixed pool of KV blocks with reference counts, a hash index and LRU eviction."""

    def __init__(
        self, num_blocks: int, block_size: int, offload_blocks: int = 0, offload_factor: int = 1
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Unpinned blocks: those holding nothing are handed out before any cached one is evicted.
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.events: list[dict[str, Any]] | None = None
        """What changed since the engine last published (None: KV events are off)."""
        self.offload = (
            OffloadTier(offload_blocks, block_size, offload_factor) if offload_blocks else None
        )

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def lookup_and_allocate(
        self,
        tokens: Sequence[int],
        extra_tokens: int,
        salt: int = 0,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> Allocation | None:
        """Pin the cached prefix of ``tokens`` and allocate the rest of prompt + extra_tokens.

        Returns None, changing nothing, when the free and evictable blocks do not suffice.
        """
        hashes = block_hashes(tokens, self.block_size, salt, cache_salt)
        hits = self._hits(hashes, len(tokens))
        loaded = 0
        if self.offload is not None:  # past the cached blocks, short of the last token's
            usable = max(len(tokens) - 1, 0) // self.block_size
            loaded = self.offload.loadable(hashes, len(hits), usable)

        num_new = self.blocks_needed(len(tokens) + extra_tokens) - len(hits)
        hits_unpinned = sum(1 for block_id in hits if self._ref[block_id] == 0)
        if num_new > len(self._empty) + len(self._evictable) - hits_unpinned:
            return None
        if self.offload is not None:
            self.offload.touch(hashes, len(hits) + loaded)

        for block_id in hits:
            if self._ref[block_id] == 0:
                del self._evictable[block_id]
            self._ref[block_id] += 1
        new_blocks = [self._take_block() for _ in range(num_new)]
        return Allocation(
            block_ids=hits + new_blocks,
            prompt_hashes=hashes,
            num_hit_blocks=len(hits),
            num_cached_tokens=(len(hits) + loaded) * self.block_size,
            num_committed_blocks=len(hits),
            tokens=tokens if self.events is not None else (),
            lora_name=lora_name,
            cache_salt=cache_salt,
            loaded_tokens=loaded * self.block_size,
        )

    def cached_prefix_tokens(self, tokens: Sequence[int]) -> int:
        """How many prompt tokens would hit the cache now; changes nothing."""
        hits = self._hits(block_hashes(tokens, self.block_size), len(tokens))
        return len(hits) * self.block_size

    def _hits(self, hashes: list[int], num_tokens: int) -> list[int]:
        # vLLM always recomputes at least the last prompt token, to get its logits.
        max_hit_blocks = max(num_tokens - 1, 0) // self.block_size
        hits: list[int] = []
        for block_hash in hashes[:max_hit_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _take_block(self) -> int:
        if self._empty:
            block_id = self._empty.pop()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            old_hash = self._hash[block_id]
            if old_hash is not None and self._cached.get(old_hash) == block_id:
                del self._cached[old_hash]
                if self.events is not None:
                    self.events.append(block_removed([old_hash]))
            self._hash[block_id] = None
        self._ref[block_id] = 1
        return block_id

    def commit(self, allocation: Allocation, num_computed_tokens: int | None = None) -> None:
        """Make the prompt's full blocks findable once their KV is scheduled to be computed,
        as vLLM caches them at allocation (a request scheduled after them reads them after the
        forward pass wrote them). ``num_computed_tokens`` limits this to the blocks scheduled
        so far (chunked prefill)."""
        if allocation.freed:
            return
        done = len(allocation.prompt_hashes)
        if num_computed_tokens is not None:
            done = min(done, num_computed_tokens // self.block_size)
        stored: list[int] = []
        for i in range(allocation.num_committed_blocks, done):
            block_hash = allocation.prompt_hashes[i]
            # A concurrent request may have committed the same content first: keep that one.
            if block_hash not in self._cached:
                block_id = allocation.block_ids[i]
                self._cached[block_hash] = block_id
                self._hash[block_id] = block_hash
                stored.append(i)
        first = allocation.num_committed_blocks
        allocation.num_committed_blocks = max(allocation.num_committed_blocks, done)
        if stored and self.events is not None:
            self._note_stored(allocation, stored)
        if self.offload is not None and done > first:
            self.offload.store(allocation.prompt_hashes, first, done, self.events)

    def _note_stored(self, allocation: Allocation, stored: list[int]) -> None:
        """One BlockStored per run of consecutive new blocks, as vLLM reports them."""
        size, hashes = self.block_size, allocation.prompt_hashes
        assert self.events is not None
        start = prev = stored[0]
        for i in [*stored[1:], -1]:
            if i == prev + 1:
                prev = i
                continue
            parent = hashes[start - 1] if start else None
            tokens = allocation.tokens[start * size : (prev + 1) * size]
            extra = [_extra_keys(allocation, block) for block in range(start, prev + 1)]
            self.events.append(
                block_stored(
                    hashes[start : prev + 1], parent, tokens, size, allocation.lora_name,
                    extra_keys=extra,
                )
            )  # fmt: skip
            start = prev = i

    def free(self, allocation: Allocation) -> None:
        """Unpin a request's blocks; cached ones stay findable until evicted. Idempotent."""
        if allocation.freed:
            return
        allocation.freed = True
        # Tail blocks first, so that the least recently used end of a prefix goes first and
        # shared heads (system prompts) survive longest, as in vLLM.
        for block_id in reversed(allocation.block_ids):
            self._ref[block_id] -= 1
            if self._ref[block_id] > 0:
                continue
            if self._hash[block_id] is None:
                self._empty.append(block_id)
            else:
                self._evictable[block_id] = None

    def usage(self) -> float:
        """Fraction of blocks pinned by running requests (vllm:kv_cache_usage_perc)."""
        free = len(self._empty) + len(self._evictable)
        return (self.num_blocks - free) / self.num_blocks

    def reset(self, external: bool = False) -> int | None:
        """Forget every cached block, and with ``external`` the CPU tier's too (vLLM's
        /reset_prefix_cache, whose `reset_external=true` resets its KV connector's); returns
        how many the GPU cache held, or None, keeping it, while a request holds blocks: vLLM
        refuses then (`{"success": false}`), and its caller may retry."""
        if self.offload is not None and external:  # vLLM resets its connector's either way
            self.offload.clear()
        if any(self._ref):
            return None
        dropped = len(self._cached)
        for block_id in self._cached.values():
            self._hash[block_id] = None
        self._cached.clear()
        self._empty.extend(reversed(self._evictable))
        self._evictable.clear()
        if self.events is not None:
            self.events.append(ALL_BLOCKS_CLEARED)
        return dropped
