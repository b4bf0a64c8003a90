"""Rendezvous (highest random weight) hashing: a deterministic home for each prefix.

Every gateway instance computes the same home from the same replica names with no shared
state, and removing a replica only moves the prefixes that lived on it.
"""

from __future__ import annotations

import xxhash

_SEED_MASK = (1 << 64) - 1


def hrw_score(key: int, name: str) -> int:
    return xxhash.xxh3_64_intdigest(name.encode(), key & _SEED_MASK)
