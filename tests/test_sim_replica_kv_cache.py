"""The simulated replica's KV cache: prefix hits only on committed, whole blocks after a
matching prefix; freed blocks stay cached and are evicted least recently used first, pinned
ones never; a full cache refuses; a CPU offload tier stores evicted blocks (in groups when its
blocks are larger) and loads them back; a reset drops every cached block but running ones; a
request's cache_salt keeps its blocks apart, and its BlockStored events carry the salt (and the
adapter) in vLLM's extra_keys, as the gateway reads them."""

from typing import Any

from gateway.fleet.kv_event_stream import EventStream
from replica.sim.kv_cache import KVCache
from router_policies.engine_blocks import root_key, token_block_keys
from tests.kv_events import payload
from tests.sim import toks


def test_shared_prefix_hits_only_after_commit() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    prompt = toks(0, 12)

    first = cache.lookup_and_allocate(prompt, extra_tokens=4)
    assert first is not None and first.num_cached_tokens == 0
    # Still being prefilled: a concurrent request must not hit those blocks.
    concurrent = cache.lookup_and_allocate([*prompt, 99], extra_tokens=4)
    assert concurrent is not None and concurrent.num_cached_tokens == 0

    cache.commit(first)
    longer = cache.lookup_and_allocate([*prompt, 99], extra_tokens=4)
    assert longer is not None and longer.num_cached_tokens == 12
    # The same prompt again: its last token is always recomputed, so its last block misses.
    same = cache.lookup_and_allocate(prompt, extra_tokens=4)
    assert same is not None and same.num_cached_tokens == 8


def test_hits_need_the_whole_prefix_to_match() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    original = cache.lookup_and_allocate(toks(0, 12), extra_tokens=0)
    assert original is not None
    cache.commit(original)
    # Blocks 1 and 2 hold the same tokens, but after a different first block.
    changed_head = [100, 1, 2, 3, *toks(4, 8), 99]
    assert cache.cached_prefix_tokens(changed_head) == 0
    changed_middle = [*toks(0, 4), 100, 5, 6, 7, *toks(8, 4), 99]
    assert cache.cached_prefix_tokens(changed_middle) == 4


def test_partial_blocks_are_never_shared() -> None:
    cache = KVCache(num_blocks=16, block_size=4)
    allocation = cache.lookup_and_allocate(toks(0, 7), extra_tokens=0)
    assert allocation is not None
    cache.commit(allocation)
    assert cache.cached_prefix_tokens([*toks(0, 7), 99]) == 4


def _cache_and_release(
    cache: KVCache,
    tokens: list[int],
    extra_tokens: int = 0,
    salt_as: tuple[str, int] | None = None,
    lora_name: str | None = None,
) -> None:
    """Computes ``tokens`` (salted by ``salt_as``: its cache_salt and adapter salt) and lets
    them go, cached."""
    cache_salt, salt = salt_as or (None, 0)
    allocation = cache.lookup_and_allocate(tokens, extra_tokens, salt, lora_name, cache_salt)
    assert allocation is not None
    cache.commit(allocation)
    cache.free(allocation)


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_used_first() -> None:
    cache = KVCache(num_blocks=3, block_size=4)
    a, b, c = toks(0, 4), toks(100, 4), toks(200, 4)
    for prompt in (a, b, c):
        _cache_and_release(cache, prompt)
    assert cache.usage() == 0.0
    assert all(cache.cached_prefix_tokens([*p, 1]) == 4 for p in (a, b, c))

    # Reusing A makes B the least recently used; A's new second block evicts B.
    _cache_and_release(cache, [*a, 1])
    assert cache.cached_prefix_tokens([*b, 1]) == 0
    # The next allocation takes the block left empty first, then evicts C, not A.
    _cache_and_release(cache, toks(300, 4), extra_tokens=4)
    assert cache.cached_prefix_tokens([*c, 1]) == 0
    assert cache.cached_prefix_tokens([*a, 1]) == 4


def test_pinned_blocks_are_never_evicted_and_a_full_cache_refuses() -> None:
    cache = KVCache(num_blocks=4, block_size=4)
    pinned = cache.lookup_and_allocate(toks(0, 8), extra_tokens=0)
    assert pinned is not None
    cache.commit(pinned)
    _cache_and_release(cache, toks(100, 8))

    other = cache.lookup_and_allocate(toks(200, 8), extra_tokens=0)
    assert other is not None, "the released blocks are evictable"
    assert cache.cached_prefix_tokens([*toks(0, 8), 1]) == 8, "pinned blocks survived"
    assert cache.cached_prefix_tokens([*toks(100, 8), 1]) == 0
    assert cache.usage() == 1.0

    assert cache.lookup_and_allocate(toks(300, 4), extra_tokens=0) is None
    assert cache.usage() == 1.0, "a refused allocation changes nothing"
    cache.free(other)
    cache.free(other)  # idempotent
    assert cache.usage() == 0.5


def test_a_prefix_the_cache_evicted_is_loaded_back_from_the_cpu_tier() -> None:
    a, b = toks(0, 8), toks(100, 16)
    for tier, loaded in ((6, 8), (5, 0), (0, 0)):
        cache = KVCache(num_blocks=4, block_size=4, offload_blocks=tier)
        cache.events = []
        _cache_and_release(cache, a)
        _cache_and_release(cache, b)  # B's four blocks evict A's two from the GPU cache
        assert cache.cached_prefix_tokens([*a, 1]) == 0
        again = cache.lookup_and_allocate([*a, 1], extra_tokens=0)
        assert again is not None
        # Loaded back while the tier holds A's blocks; with room for five, B's four pushed
        # out A's first, and a prefix cannot start past its first block; with no tier, A is
        # computed again.
        assert (again.num_cached_tokens, again.loaded_tokens) == (loaded, loaded)
        cpu = [e for e in cache.events if e.get("medium") == "CPU"]
        if not tier:
            assert cpu == []
            continue
        stored = [e for e in cpu if e["type"] == "BlockStored"]
        assert [len(e["block_hashes"]) for e in stored] == [2, 4]
        assert all(e["token_ids"] == [] for e in stored)
        removed = [h for e in cpu if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        assert removed == ([] if loaded else stored[0]["block_hashes"][:1])


def test_a_cpu_tier_of_larger_blocks_writes_and_loads_whole_groups() -> None:
    # vLLM's connector with a block_size of two engine blocks: a group is written once both
    # are computed, named by its last block's hash, and loaded only whole.
    a, b = toks(0, 12), toks(100, 16)  # A: three blocks, one group and a half
    cache = KVCache(num_blocks=4, block_size=4, offload_blocks=8, offload_factor=2)
    cache.events = []
    _cache_and_release(cache, a)
    _cache_and_release(cache, b)
    again = cache.lookup_and_allocate([*a, 1], extra_tokens=0)
    assert again is not None
    assert again.loaded_tokens == 8, "the first group only: A's third block has no group"
    stored = [e for e in cache.events if e.get("medium") == "CPU" and e["type"] == "BlockStored"]
    assert [e["block_size"] for e in stored] == [8, 8]
    assert [len(e["block_hashes"]) for e in stored] == [1, 2]
    gpu = [e for e in cache.events if e.get("medium") != "CPU" and e["type"] == "BlockStored"]
    assert stored[0]["block_hashes"] == gpu[0]["block_hashes"][1:2], "named by its last block"


def test_a_refused_allocation_leaves_the_cpu_tiers_order_alone() -> None:
    cache = KVCache(num_blocks=2, block_size=4, offload_blocks=4)
    cache.events = []
    a = toks(0, 8)
    _cache_and_release(cache, a)
    _cache_and_release(cache, toks(100, 8))  # the tier holds A's two blocks, then B's
    assert cache.lookup_and_allocate([*a, *toks(500, 8), 1], extra_tokens=0) is None
    _cache_and_release(cache, toks(200, 4))  # one block more: the tier evicts its oldest
    cpu = [e for e in cache.events if e.get("medium") == "CPU"]
    removed = [e["block_hashes"] for e in cpu if e["type"] == "BlockRemoved"]
    assert removed == [cpu[0]["block_hashes"][:1]], "A's first block, still the least recent"


def test_reset_drops_cached_blocks_once_no_request_holds_any() -> None:
    cache = KVCache(num_blocks=4, block_size=4)
    _cache_and_release(cache, toks(0, 8))
    running = cache.lookup_and_allocate(toks(100, 8), extra_tokens=0)
    assert running is not None
    cache.commit(running)

    assert cache.reset() is None, "refused while a request holds blocks, as vLLM's"
    assert cache.cached_prefix_tokens([*toks(0, 8), 1]) == 8
    cache.free(running)
    assert cache.reset() == 4
    assert cache.cached_prefix_tokens([*toks(0, 8), 1]) == 0
    assert cache.cached_prefix_tokens([*toks(100, 8), 1]) == 0
    assert cache.lookup_and_allocate(toks(200, 16), extra_tokens=0) is not None


def test_reset_empties_the_cpu_tier_only_when_asked_as_vllms_reset_external() -> None:
    a = toks(0, 8)
    for external, loaded in ((False, 8), (True, 0)):
        cache = KVCache(num_blocks=4, block_size=4, offload_blocks=6)
        _cache_and_release(cache, a)
        assert cache.reset(external) == 2
        again = cache.lookup_and_allocate([*a, 1], extra_tokens=0)
        assert again is not None and again.loaded_tokens == loaded


def test_a_cache_salt_keeps_blocks_apart_as_vllms_first_block_hash_does() -> None:
    cache = KVCache(num_blocks=64, block_size=4)
    prompt = toks(0, 12)
    _cache_and_release(cache, prompt, salt_as=("tenant-a", 0))
    asked = [*prompt, 99]

    def hit(cache_salt: str | None, salt: int = 0) -> int:
        allocation = cache.lookup_and_allocate(asked, 0, salt, cache_salt=cache_salt)
        assert allocation is not None
        cache.free(allocation)
        return allocation.num_cached_tokens

    assert hit("tenant-a") == 12
    assert hit("tenant-b") == 0
    assert hit(None) == 0, "a salted request never shares with an unsalted one"
    assert hit("tenant-a", salt=7) == 0, "nor across adapters"
    _cache_and_release(cache, prompt)
    assert hit(None) == 12
    assert hit("tenant-b") == 0, "nor an unsalted request with a salted one"


def _stored_events(cache: KVCache) -> list[dict[str, Any]]:
    assert cache.events is not None
    return [e for e in cache.events if e["type"] == "BlockStored"]


def _gateway_reads(events: list[dict[str, Any]]) -> EventStream:
    stream = EventStream("tcp://unused")
    for seq, event in enumerate(events):
        stream.apply(seq, payload(event))
    return stream


def test_a_salted_block_stored_event_names_the_salt_where_the_gateway_reads_it() -> None:
    # vLLM 0.32 (to_event_extra_keys): one entry per block, the adapter's name on each, the
    # salt on the request's first block only; None for a block with neither.
    cache = KVCache(num_blocks=64, block_size=16)
    cache.events = []
    prompt = toks(1000, 64)
    _cache_and_release(cache, prompt, salt_as=("tenant-a", 0))
    (event,) = _stored_events(cache)
    assert event["extra_keys"] == [["tenant-a"], None, None, None]
    stream = _gateway_reads([event])
    assert stream.blocks.match(token_block_keys(prompt, 16, root_key(None, "tenant-a"))) == 4
    assert stream.blocks.match(token_block_keys(prompt, 16, root_key(None, "tenant-b"))) == 0
    assert stream.blocks.match(token_block_keys(prompt, 16, root_key(None, None))) == 0

    cache.events = []
    _cache_and_release(cache, prompt, salt_as=("tenant-a", 7), lora_name="adapter")
    (event,) = _stored_events(cache)
    assert event["lora_name"] == "adapter"
    assert event["extra_keys"] == [["adapter", "tenant-a"], ["adapter"], ["adapter"], ["adapter"]]
    root = root_key("adapter", "tenant-a")
    assert _gateway_reads([event]).blocks.match(token_block_keys(prompt, 16, root)) == 4

    cache.events = []
    _cache_and_release(cache, prompt)
    (event,) = _stored_events(cache)
    assert event["extra_keys"] == [None] * 4, "vLLM lists a block with no extra keys as None"


def test_a_salted_prompt_prefilled_in_chunks_names_its_salt_on_the_first_event_only() -> None:
    cache = KVCache(num_blocks=64, block_size=16)
    cache.events = []
    prompt = toks(1000, 64)
    allocation = cache.lookup_and_allocate(prompt, 0, cache_salt="tenant-a")
    assert allocation is not None
    cache.commit(allocation, 32)
    cache.commit(allocation, 64)
    first, second = _stored_events(cache)
    assert first["extra_keys"] == [["tenant-a"], None]
    assert second["parent_block_hash"] == first["block_hashes"][-1]
    assert second["extra_keys"] == [None, None]
    stream = _gateway_reads([first, second])
    assert stream.blocks.match(token_block_keys(prompt, 16, root_key(None, "tenant-a"))) == 4
