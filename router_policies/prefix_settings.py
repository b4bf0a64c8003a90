"""How prompts are fingerprinted, and how much of a match is worth pinning for: a pool's
`prefix:` section."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from router_policies.block_layout import BlockLayout
from router_policies.kv_events_settings import KvEventsSettings, PrefixSource
from router_policies.strict_model import StrictModel
from router_policies.yaml_locations import error_at

_NOT_DIGESTS: dict[str, Any] = {
    "min_match_blocks": True, "min_match_ratio": True, "chars_per_token": True,
    "index_blocks": True, "index_memory": True,
    "max_blocks": True,  # a longer or shorter chain of the same digests
    "events": {"stall_s": True, "resync_s": True, "tokenize_timeout_s": True},
}  # fmt: skip
"""Prefix settings that weigh a match, size the index (each replica's index is resized at its
next scrape) or time the events, not what a digest means: tuned live, they keep what the
indexes hold."""


class PrefixSettings(StrictModel):
    """How prompts are fingerprinted and how much of a match is worth pinning for."""

    block_bytes: Annotated[int, Field(ge=16, le=65536)] = 128
    """Size of the fingerprint's first blocks, in bytes of canonical prompt text (~32 tokens)."""
    doubling_blocks: Annotated[int, Field(ge=0, le=4096)] = 16
    """The block size doubles after every this many blocks (0: fixed), so hashing a whole
    long prompt stays cheap while a match is known to within 1/doubling_blocks of its length."""
    max_blocks: Annotated[int, Field(ge=1, le=1 << 20)] = 4096
    """Cap on fingerprint length in blocks: with doubling, far above the gateway's body limit,
    so the whole prompt is hashed and long conversations stay apart."""
    min_match_blocks: Annotated[int, Field(ge=1, le=1 << 20)] = 1
    """A match shorter than this is not worth pinning for. At most max_blocks' own bound: no
    match is longer than the fingerprint, and a far larger count's length in bytes, which
    doubles every doubling_blocks, is an int of millions of digits computed per request."""
    min_match_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """A prompt whose shared lead (or match) is at least this share of it is worth a home
    (Preble: a cache pays when the cached part is longer than the part left to prefill);
    below it, the prompt goes by load."""
    index_blocks: Annotated[int, Field(ge=1, le=1 << 32)] = 65536
    """Per-replica index capacity, in block_bytes units, until the replica's KV size is known
    from its metrics. At most 2^32: 512 GiB of 128-byte blocks, past any engine's KV cache (the
    figure is also used as a float, which a far larger int overflows)."""
    index_memory: Annotated[float, Field(ge=0.25, le=16.0)] = 1.25
    """How many of a replica's KV caches' worth of prompt blocks its index remembers. At 1 the
    index forgets about when the engine evicts, so what it says is held mostly is. Above 1 a
    prompt whose history the engine has probably evicted still goes where that history went,
    and prompts sharing long prefixes gather again on one replica, as under the peers' trees,
    which never forget; the cost model then counts that history as cached. On Mooncake's
    tuning windows, loaded, 1.25 kept 3.5-8 points more of the affinity bound on the
    synthetic trace (prefixes shared across many requests) and moved the conversation trace's
    within its spread (docs/benchmarks.md), so 1.25."""
    chars_per_token: Annotated[float, Field(ge=0.1, le=100.0)] = 4.0
    """Bytes of prompt per model token until the replicas' reported usage teaches the real
    figure (real BPE tokenizers pack 2-4, byte-level fallback 1). The bounds are ten times past
    any tokenizer either way, and keep the token and block counts made from it finite ints."""
    source: PrefixSource = PrefixSource.AUTO
    """What the router believes each replica holds: its engine's KV-cache events where it
    publishes them (auto, the default; `events` sets where), or only them (events), or only
    the estimate. On Mooncake's conversation tuning windows the events kept 0.7-3 points more
    of the affinity bound than the estimate (docs/benchmarks.md); a replica with no endpoint
    set, or whose stream is not whole, is routed to on the estimate."""
    events: KvEventsSettings = KvEventsSettings()

    @model_validator(mode="after")
    def _reachable_match(self) -> PrefixSettings:
        if self.min_match_blocks > self.max_blocks:
            # No match is longer than the fingerprint: every prompt would go by load.
            raise error_at(
                ("min_match_blocks",),
                f"min_match_blocks ({self.min_match_blocks}) is above max_blocks "
                f"({self.max_blocks}): no match could reach it",
                self.min_match_blocks,
            )
        return self

    @property
    def layout(self) -> BlockLayout:
        return BlockLayout(self.block_bytes, self.doubling_blocks)

    def same_digests(self, other: PrefixSettings) -> bool:
        """Whether an index built under these settings survives a reload to ``other``: only
        while its digests mean the same. Digests of another block layout, or of another key
        source (which replicas' events give token keys), match nothing."""
        return self.model_dump(exclude=_NOT_DIGESTS) == other.model_dump(exclude=_NOT_DIGESTS)
