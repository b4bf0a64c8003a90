"""What one replica's engine holds, exactly: the blocks its KV-cache events say it stored and
has not evicted (vLLM's ``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``).

The engine's own block hashes depend on its hash function and a per-process seed, so they are
not recomputed here: each stored block is re-keyed by its token ids, chained through its parent
(the first block seeded by the adapter and cache salt, which the engine keys its blocks by too),
and a request's tokens are keyed the same way (``token_block_keys``) to be matched against it.

Blocks the engine also holds in another tier (vLLM's CPU offloading: events with a ``medium``
other than the GPU's) count as held: the engine loads them back rather than computing them,
and reports them among its cached tokens. Such events carry no token ids, so a block is known
there by the key its GPU event gave it. A tier's block may span several of the engine's (vLLM's
``offloaded_block_size``, a multiple of the GPU's): it carries the hash of the last of them and
holds them all, the groups counted from a prompt's start. How many it spans is its event's
block size over the engine's, or, where its event gives none (vLLM's default, events that only
name the tier block by that last hash), the greatest common divisor of those last blocks'
places in their chains: a prompt's first tier block ends at the multiple itself.

A lost event leaves which blocks the engine still holds unknown, but not what each block it
reported holds: that depends on content alone. Those blocks are kept aside (``forget``), and one
the engine computes a block on top of is held again, with the chain before it: vLLM never
reports a block it still caches again, so without them a hot system prompt's continuations
could not be keyed until the engine evicted it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Container, Hashable, Sequence

import xxhash

EngineHash = Hashable
"""An engine's block hash as its events carry it (vLLM: bytes or int)."""
Block = tuple[int | None, EngineHash | None, int]
"""A stored block's key (None: it cannot be keyed), its parent's engine hash, and how many
blocks its chain has up to it (0: not known, its chain began before the gateway listened)."""


def root_key(lora_name: str | None, cache_salt: str | None) -> int:
    """Seed of a chain's first block: engines never share blocks across adapters or salts."""
    return xxhash.xxh3_64_intdigest(f"{lora_name or ''}\x00{cache_salt or ''}".encode())


def token_block_keys(tokens: Sequence[int], block_size: int, root: int) -> tuple[int, ...]:
    """Chained keys of the full blocks of ``tokens``: key i identifies blocks 0..i."""
    data = array("q", tokens).tobytes()
    stride = block_size * 8
    digest = xxhash.xxh3_64_intdigest
    keys: list[int] = []
    prev = root
    for start in range(0, (len(tokens) // block_size) * stride, stride):
        prev = digest(data[start : start + stride], prev)
        keys.append(prev)
    return tuple(keys)


def leading(keys: Sequence[int], held: Container[int]) -> int:
    """How many of ``keys``, from the first, are in ``held``. A scan, not a bisection: an
    engine's cache need not stay prefix-closed."""
    for i, key in enumerate(keys):
        if key not in held:
            return i
    return len(keys)


def cached_tokens(matched_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens an engine reuses for a prompt whose first ``matched_blocks`` it holds: whole
    blocks, short of the last prompt token, which it always recomputes for its logits."""
    usable = max(prompt_tokens - 1, 0) // block_size if block_size else 0
    return min(matched_blocks, usable) * block_size


class EngineBlocks:
    """The blocks one engine holds, keyed by their tokens (see the module docstring)."""

    __slots__ = (
        "_before",
        "_copies",
        "_held",
        "_tier_copies",
        "_tier_ends",
        "_tiered",
        "block_size",
        "tier_evicted",
        "tier_factor",
    )

    def __init__(self) -> None:
        self._held: dict[EngineHash, Block] = {}
        """Engine hash -> the block, for blocks the engine holds; a key None for one that cannot
        be keyed (its parent came before the gateway listened, or it holds images): its
        descendants cannot be keyed either."""
        self._before: dict[EngineHash, Block] = {}
        """What was held when the last event went missing, less what was evicted or held again
        since: at most one loss's worth, so evictions lost with it cannot pile up."""
        self._copies: dict[int, int] = {}
        """Our key -> how many of the engine's blocks hold it (an engine may compute one
        content twice, in two concurrent requests, and evicts the copies one at a time)."""
        self.block_size = 0
        """Tokens per block, from the events (0 until the first one)."""
        self._tiered: dict[tuple[str, EngineHash], int] = {}
        """(medium, engine hash) -> our key, for blocks another tier holds."""
        self._tier_copies: dict[int, int] = {}
        """Our key (of a tier block's last engine block) -> how many tiers hold it."""
        self.tier_factor = 1
        """Engine blocks per tier block, from the tier's events."""
        self._tier_ends = 0
        """The greatest common divisor of the chain places of the blocks that end a tier's
        block, from events that give no block size (0: none seen)."""
        self.tier_evicted = False
        """Whether another tier has evicted a block: until it does, it holds every block the
        engine wrote to it, and its size is not known."""

    def __len__(self) -> int:
        return len(self._copies)

    @property
    def tier_tokens(self) -> int:
        """Tokens another tier holds (its events' blocks, keyed): its size, once it has
        evicted."""
        return len(self._tier_copies) * self.tier_factor * self.block_size

    def stored(
        self,
        hashes: Sequence[EngineHash],
        parent: EngineHash | None,
        token_ids: Sequence[int],
        block_size: int,
        root: int,
        keyable: Sequence[bool] | None = None,
    ) -> None:
        """Blocks the engine stored, in chain order; ``keyable[i]`` False for a block whose
        engine key holds more than its tokens (an image's): no request's tokens match it."""
        # Checked before anything changes: the request path reads block_size.
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block size {block_size!r} is not a positive whole number")
        data = array("q", token_ids).tobytes()
        self.block_size = block_size
        prev, depth = (root, 0) if parent is None else self._parent(parent)
        placed = parent is None or depth > 0  # where the chain began is known
        digest = xxhash.xxh3_64_intdigest
        stride = block_size * 8
        held, before = self._held, self._before
        for i, engine_hash in enumerate(hashes):
            if prev is not None and (keyable is None or keyable[i]):
                prev = digest(data[i * stride : (i + 1) * stride], prev)
            else:
                prev = None
            depth = depth + 1 if placed else 0
            if engine_hash in held:
                # A second copy of a block already held: the same content, the same key.
                self._count(held[engine_hash][0], 1)
            else:
                before.pop(engine_hash, None)
                held[engine_hash] = (prev, parent, depth)
                self._count(prev, 1)
            parent = engine_hash

    def removed(self, hashes: Sequence[EngineHash]) -> None:
        for engine_hash in hashes:
            self._before.pop(engine_hash, None)
            block = self._held.get(engine_hash)
            if block is None:
                continue
            key = block[0]
            if key is None or self._count(key, -1) == 0:
                del self._held[engine_hash]

    def offloaded(self, medium: str, hashes: Sequence[EngineHash], block_size: int = 0) -> None:
        """Blocks another tier stored, each ``block_size`` tokens (the engine's where not
        given); one the GPU's events never keyed cannot be matched."""
        if type(block_size) is not int:
            raise ValueError(f"block size {block_size!r} is not a whole number")
        if block_size > 0 and self.block_size:
            self.tier_factor = max(block_size // self.block_size, 1)
        for engine_hash in hashes:
            block = self._held.get(engine_hash) or self._before.get(engine_hash)
            if block_size <= 0 and block is not None and block[2]:
                self._tier_ends = math.gcd(self._tier_ends, block[2])
                self.tier_factor = self._tier_ends
            key = None if block is None else block[0]
            if key is not None and (medium, engine_hash) not in self._tiered:
                self._tiered[medium, engine_hash] = key
                _count(self._tier_copies, key, 1)

    def unloaded(self, medium: str, hashes: Sequence[EngineHash]) -> None:
        """Blocks another tier evicted."""
        self.tier_evicted = True
        for engine_hash in hashes:
            key = self._tiered.pop((medium, engine_hash), None)
            if key is not None:
                _count(self._tier_copies, key, -1)

    def clear(self) -> None:
        """The engine holds nothing (it restarted, or emptied its cache)."""
        self.forget()
        self._before = {}
        self._tier_ends = 0  # a new process's tier may be another size

    def forget(self) -> None:
        """Events went missing: nothing is known to be held, though what each block reported
        holds still is (see the module docstring)."""
        self._before = self._held
        self._held = {}
        self._copies.clear()
        self._tiered.clear()
        self._tier_copies.clear()
        self.tier_evicted = False  # a restarted engine's tier, or an emptied one, fills anew

    def match(self, keys: Sequence[int]) -> int:
        """Leading blocks of a request (its ``token_block_keys``) the engine holds, in any
        tier."""
        if not self._tier_copies:
            return leading(keys, self._copies)
        factor = self.tier_factor
        copies, tier, n = self._copies, self._tier_copies, len(keys)
        for i, key in enumerate(keys):
            if key in copies:
                continue
            last = i - i % factor + factor - 1  # the tier block's last engine block
            if last >= n or keys[last] not in tier:
                return i
        return n

    def _parent(self, parent: EngineHash) -> tuple[int | None, int]:
        """The key and chain place of a stored block's parent. The engine holds the parent,
        and every block before it, while it computes the block: one known only from before a
        loss is held again, with those before it."""
        block = self._held.get(parent)
        if block is not None:
            return block[0], block[2]
        block = self._before.get(parent)
        if block is None:
            return None, 0
        engine_hash: EngineHash | None = parent
        while engine_hash is not None and engine_hash not in self._held:
            recalled = self._before.pop(engine_hash, None)
            if recalled is None:
                break
            self._held[engine_hash] = recalled
            self._count(recalled[0], 1)
            engine_hash = recalled[1]
        return block[0], block[2]

    def _count(self, key: int | None, delta: int) -> int:
        return 0 if key is None else _count(self._copies, key, delta)


def _count(copies: dict[int, int], key: int, delta: int) -> int:
    left = copies.get(key, 0) + delta
    if left > 0:
        copies[key] = left
    else:
        copies.pop(key, None)
    return left
