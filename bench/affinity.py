"""The affinity upper bound of a workload: the prefix-cache hit rate no routing can beat.

Picture one replica with an unbounded prefix cache that sees every prompt in the order they
were sent: a prompt hits on its longest run of full KV blocks that an earlier prompt already
computed, and misses on the rest. Its hit rate, ``1 - tokens never seen before / all prompt
tokens``, bounds what any routing over any fleet can reach: splitting the traffic over replicas
can only add first-time misses, and finite caches only add evictions. So a fleet's measured hit
rate reads as a fraction of this bound.

Prompts are tokenized and hashed exactly as the simulated replica does (its chat template,
``chars_per_token`` characters per token, chained block hashes, and vLLM's rule that the last
prompt token is always recomputed), so for the sim the bound is exact. For real vLLM, whose
tokenizer and block size differ, the same computation is an estimate of the same quantity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from replica.sim.kv_cache import block_hashes
from replica.sim.tokenizer import render_chat, tokenize

DEFAULT_BLOCK_SIZE = 16
"""The sim's (and vLLM's GPU) default KV block size, in tokens."""
DEFAULT_CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class AffinityBound:
    prompt_tokens: int
    """All prompt tokens sent."""
    reusable_tokens: int
    """Prompt tokens an unbounded single cache would have served from earlier prompts."""

    @property
    def bound(self) -> float:
        """The highest fleet hit rate possible; 0 for no prompts."""
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


Messages = Sequence[Mapping[str, object]]


def affinity_bound(
    prompts: Iterable[Messages],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chars_per_token: int = DEFAULT_CHARS_PER_TOKEN,
) -> AffinityBound:
    """The bound over chat prompts (message lists) in the order they were sent."""
    return affinity_bound_with_tools(
        ((messages, ()) for messages in prompts),
        block_size=block_size,
        chars_per_token=chars_per_token,
    )


def affinity_bound_with_tools(
    prompts: Iterable[tuple[Messages, Messages]],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chars_per_token: int = DEFAULT_CHARS_PER_TOKEN,
) -> AffinityBound:
    """The bound over (messages, tools) prompts in the order they were sent: the tools'
    schemas are rendered ahead of the messages, as the sim's template does, so an agent's
    tools are part of its shared lead."""
    seen: set[int] = set()
    total = reusable = 0
    for messages, tools in prompts:
        tokens = tokenize(render_chat(messages, tools or None), chars_per_token)
        hashes = block_hashes(tokens, block_size)
        # vLLM always recomputes the last prompt token (for its logits): a prompt of exactly
        # k full blocks can hit on k - 1 of them at most.
        usable = max(len(tokens) - 1, 0) // block_size
        hits = 0
        # Chained hashes: a known block implies its whole prefix is known, so stop at the first
        # unknown one, as a prefix cache does.
        for block_hash in hashes[:usable]:
            if block_hash not in seen:
                break
            hits += 1
        seen.update(hashes)
        total += len(tokens)
        reusable += hits * block_size
    return AffinityBound(total, reusable)
