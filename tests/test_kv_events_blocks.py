"""The gateway's index of what an engine holds, built from its KV-cache events: a stored chain
matches a request's token blocks up to the first block removed, a block stored twice is held
until both copies go, a chain whose parent came before the gateway listened cannot be keyed,
an adapter's blocks match only that adapter, a block another tier (the CPU) holds stays
matchable after the GPU evicts it, after a lost event a block stored on a chain known before
holds that chain again (but one loss's worth is kept, no more), and the engine never reuses a
prompt's last token."""

from __future__ import annotations

from router_policies.engine_blocks import EngineBlocks, cached_tokens, root_key, token_block_keys
from tests.kv_events import ROOT, TOKENS, stored_chain


class TestEngineBlocks:
    def test_a_stored_chain_matches_the_requests_token_blocks(self) -> None:
        blocks = EngineBlocks()
        stored_chain(blocks, TOKENS)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        longer = TOKENS + list(range(5000, 5032))
        assert blocks.match(token_block_keys(longer, 16, ROOT)) == 4
        other = [7, *TOKENS[1:]]
        assert blocks.match(token_block_keys(other, 16, ROOT)) == 0

    def test_a_removed_block_ends_the_match_there(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.removed([hashes[2]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 2

    def test_a_block_stored_twice_is_held_until_both_copies_go(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        stored_chain(blocks, TOKENS)
        blocks.removed([hashes[0]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        blocks.removed([hashes[0]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_children_of_a_block_stored_before_the_gateway_listened_cannot_be_keyed(self) -> None:
        blocks = EngineBlocks()
        blocks.stored([2, 3], 1, TOKENS[16:48], 16, ROOT)  # parent 1 never seen
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0
        assert len(blocks) == 0

    def test_an_adapters_blocks_match_only_that_adapter(self) -> None:
        blocks = EngineBlocks()
        blocks.stored([1, 2], None, TOKENS[:32], 16, root_key("sql-lora", None))
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0
        assert blocks.match(token_block_keys(TOKENS, 16, root_key("sql-lora", None))) == 2

    def test_a_block_the_gpu_evicted_is_held_while_another_tier_holds_it(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.offloaded("CPU", hashes[:3])
        blocks.removed(hashes)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 3
        blocks.unloaded("CPU", [hashes[1]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 1
        blocks.clear()
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_a_tier_block_of_two_engine_blocks_holds_both_known_by_the_last(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.offloaded("CPU", [hashes[1], hashes[3]], block_size=32)  # vLLM: every 2nd hash
        blocks.removed(hashes)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        assert blocks.tier_tokens == 64
        # A prompt ending inside a tier block loads none of it: the tier's blocks are whole.
        assert blocks.match(token_block_keys(TOKENS[:48], 16, ROOT)) == 2
        blocks.unloaded("CPU", [hashes[1]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_a_tier_blocks_size_unsaid_is_read_from_where_its_blocks_end(self) -> None:
        """vLLM's default: an event per tier block naming only its last engine block, with no
        block size. A prompt's first tier block ends at the multiple itself."""
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS)
        blocks.offloaded("CPU", [hashes[3]])  # could be 4 blocks a tier block, or 2, or 1
        blocks.offloaded("CPU", [hashes[1]])
        assert blocks.tier_factor == 2
        blocks.removed(hashes)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        assert blocks.tier_tokens == 64

    def test_another_tiers_block_no_gpu_event_keyed_matches_nothing(self) -> None:
        blocks = EngineBlocks()
        blocks.offloaded("CPU", [1, 2])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_after_a_loss_a_block_stored_on_a_known_chain_holds_the_chain_again(self) -> None:
        blocks = EngineBlocks()
        hashes = stored_chain(blocks, TOKENS[:48])
        blocks.forget()
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0
        blocks.stored([9], hashes[-1], TOKENS[48:64], 16, ROOT)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 4
        blocks.removed([hashes[0]])
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_what_a_loss_keeps_aside_goes_at_the_next_loss(self) -> None:
        """What the engine held at one loss, no more: the evictions lost with each message
        would otherwise pile up."""
        blocks = EngineBlocks()
        system = stored_chain(blocks, TOKENS[:32])
        blocks.forget()
        blocks.forget()
        blocks.stored([9], system[-1], TOKENS[32:48], 16, ROOT)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 0

    def test_a_chain_stored_on_between_losses_is_kept_through_them(self) -> None:
        blocks = EngineBlocks()
        system = stored_chain(blocks, TOKENS[:32])
        for engine_hash in (9, 10, 11):
            blocks.forget()
            blocks.stored([engine_hash], system[-1], TOKENS[32:48], 16, ROOT)
        assert blocks.match(token_block_keys(TOKENS, 16, ROOT)) == 3

    def test_the_engine_never_reuses_the_prompts_last_token(self) -> None:
        assert cached_tokens(4, 64, 16) == 48  # 63 tokens reusable: 3 whole blocks
        assert cached_tokens(4, 65, 16) == 64
        assert cached_tokens(2, 65, 16) == 32
