"""Prompt fingerprints: shared prefixes share leading digests, and nothing else does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gateway.fleet.pools import PoolState
from router_policies.block_layout import BlockLayout
from router_policies.fingerprint import (
    CanonicalPrompt,
    RequestFeatures,
    block_hashes,
    canonical_chat,
    canonical_prompt,
    canonical_responses,
    fingerprint,
)
from router_policies.prefix_index import PrefixIndex, Recorded
from router_policies.schema import PoolPolicy

FIXED = BlockLayout(128)
DOUBLING = BlockLayout(128, 16)

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def chat_features(
    messages: Sequence[Mapping[str, Any]], model: str = "m", salt: str = ""
) -> RequestFeatures:
    return fingerprint(model, canonical_chat(messages), FIXED, 256, salt)


def test_requests_sharing_a_system_prompt_share_leading_blocks() -> None:
    a = chat_features([SYSTEM, {"role": "user", "content": "What is 2+2?"}])
    b = chat_features([SYSTEM, {"role": "user", "content": "Name a prime."}])
    shared = len(canonical_chat([SYSTEM]).text) // 128
    assert shared > 5
    assert a.block_hashes[:shared] == b.block_hashes[:shared]
    assert a.block_hashes[-1] != b.block_hashes[-1]


def test_a_later_turn_extends_the_earlier_turns_fingerprint() -> None:
    turn1 = [SYSTEM, {"role": "user", "content": "Tell me about tides. " * 10}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "Tides are..."},
        {"role": "user", "content": "And?"},
    ]
    f1, f2 = chat_features(turn1), chat_features(turn2)
    full_blocks = len(canonical_chat(turn1).text) // 128
    assert f2.block_hashes[:full_blocks] == f1.block_hashes[:full_blocks]


def test_a_system_message_after_the_first_turn_stays_in_place() -> None:
    """Chat templates render a system or developer message an app inserts mid-conversation
    (RAG context, an agent step) where it stands: the request shares every block of the
    history before it, and only the opening system message is the lead."""
    history = [
        SYSTEM,
        {"role": "user", "content": "Tell me about tides. " * 20},
        {"role": "assistant", "content": "Tides are the rise and fall of the sea. " * 10},
    ]
    whole = len(canonical_chat(history).text) // 128
    for role in ("system", "developer"):
        later = [
            *history,
            {"role": role, "content": "Context update: the moon is full tonight."},
            {"role": "user", "content": "And tonight?"},
        ]
        prompt = canonical_chat(later)
        assert prompt.text.startswith(canonical_chat(history).text)
        assert prompt.lead_bytes == canonical_chat([SYSTEM]).lead_bytes
        assert (
            chat_features(later).block_hashes[:whole] == chat_features(history).block_hashes[:whole]
        )
    user = {"role": "user", "content": "hi"}
    assert canonical_chat([user, SYSTEM]) != canonical_chat([SYSTEM, user])
    assert canonical_chat([user, SYSTEM]).lead_bytes == 0


def test_the_lead_is_every_system_and_developer_message_before_the_first_turn() -> None:
    developer = {"role": "developer", "content": "Answer in French."}
    user = {"role": "user", "content": "hi"}
    opening = canonical_chat([SYSTEM, developer], tools=[{"type": "function"}])
    prompt = canonical_chat([SYSTEM, developer, user], tools=[{"type": "function"}])
    assert prompt.lead_bytes == opening.lead_bytes == len(opening.text)
    assert prompt.text.startswith(opening.text)


def test_a_responses_system_item_after_the_first_turn_stays_in_place_as_in_chat() -> None:
    question = {"role": "user", "content": "Where is it?"}
    update = {"role": "developer", "content": "Context update: it moved."}
    responses = canonical_responses(
        {"instructions": SYSTEM["content"], "input": [question, update]}
    )
    assert responses == canonical_chat([SYSTEM, question, update])
    assert responses.lead_bytes == canonical_chat([SYSTEM]).lead_bytes


def test_model_and_cache_salt_seed_the_chain() -> None:
    messages = [SYSTEM]
    base = chat_features(messages)
    assert chat_features(messages, model="other").block_hashes[0] != base.block_hashes[0]
    assert chat_features(messages, salt="tenant-1").block_hashes[0] != base.block_hashes[0]


def test_fingerprint_length_is_capped() -> None:
    features = fingerprint("m", b"x" * 100_000, FIXED, 16)
    assert len(features.block_hashes) == 16
    assert features.hashed_bytes == 128 * 16


def test_text_parts_fingerprint_like_plain_content() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    plain = {"role": "user", "content": "hello"}
    assert canonical_chat([parts]) == canonical_chat([plain])


def test_text_parts_are_joined_with_a_newline_as_vllm_joins_them() -> None:
    """vLLM's string content format (and the sim) render parts ["A", "B"] joined by a newline:
    the same engine prompt as that string, not as "AB"."""
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
    }
    assert canonical_chat([parts]) == canonical_chat([{"role": "user", "content": "A\nB"}])
    assert canonical_chat([parts]) != canonical_chat([{"role": "user", "content": "AB"}])


def _called(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": arguments}}
    return [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, clear"},
    ]


def test_tool_call_arguments_match_whatever_their_whitespace_but_not_their_key_order() -> None:
    """vLLM parses a call's arguments before the template renders them, so a client that
    re-serialises its history compactly sends the same engine prompt; a change of key order
    is a different prompt (tojson keeps it)."""
    spaced = canonical_chat(_called('{"city": "Paris", "unit": "celsius"}'))
    assert canonical_chat(_called('{"city":"Paris","unit":"celsius"}')) == spaced
    assert canonical_chat(_called('{\n  "city" : "Paris",\n  "unit" : "celsius"\n}')) == spaced
    assert canonical_chat(_called('{"unit": "celsius", "city": "Paris"}')) != spaced


def test_tool_call_arguments_that_do_not_parse_are_hashed_as_sent() -> None:
    broken = '{"city": "Par'
    assert canonical_chat(_called(broken)) == canonical_chat(_called(broken))
    assert canonical_chat(_called(broken)) != canonical_chat(_called('{"city":"Par'))
    assert b'{\\"city\\": \\"Par' in canonical_chat(_called(broken)).text
    # Deeper than orjson writes (255 levels) though it reads it: hashed as sent, never an error.
    deep = "[" * 300 + "]" * 300
    assert deep.encode() in canonical_chat(_called(deep)).text


def test_tool_loops_that_called_differently_part_at_the_call() -> None:
    task = [SYSTEM, {"role": "user", "content": "Find the invoice and total it. " * 10}]

    def called(city: str) -> list[dict[str, Any]]:
        call = {"id": "c1", "type": "function",
                "function": {"name": "search", "arguments": f'{{"city": "{city}"}}'}}  # fmt: skip
        return [
            *task,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "found nothing " * 20},
        ]

    paris, rome = chat_features(called("Paris")), chat_features(called("Rome"))
    shared = len(canonical_chat(task).text) // 128
    assert paris.block_hashes[:shared] == rome.block_hashes[:shared]
    assert paris.block_hashes[-1] != rome.block_hashes[-1]
    # The loop's next step still extends its own fingerprint.
    again = chat_features([*called("Paris"), {"role": "assistant", "content": "Done."}])
    whole = len(canonical_chat(called("Paris")).text) // 128
    assert again.block_hashes[:whole] == paris.block_hashes[:whole]


def test_completion_prompts_of_every_shape_are_accepted() -> None:
    assert canonical_prompt("abc").text == b"abc"
    assert canonical_prompt(["a", "b"]) != canonical_prompt(["ab"])
    assert canonical_prompt([1, 2, 3]).text == b"[1,2,3]"


def test_index_matches_the_longest_held_prefix() -> None:
    index = PrefixIndex(capacity=100, layout=FIXED)
    a = chat_features([SYSTEM, {"role": "user", "content": "question one " * 30}])
    b = chat_features([SYSTEM, {"role": "user", "content": "question two " * 30}])
    index.insert(a.block_hashes)
    shared = len(canonical_chat([SYSTEM]).text) // 128
    assert index.match_length(a.block_hashes) == len(a.block_hashes)
    assert shared <= index.match_length(b.block_hashes) < len(b.block_hashes)


def test_index_evicts_extensions_before_their_prefixes() -> None:
    index = PrefixIndex(capacity=12, layout=FIXED)
    long = fingerprint("m", b"y" * 128 * 10, FIXED, 256)
    other = fingerprint("m", b"z" * 128 * 4, FIXED, 256)
    index.insert(long.block_hashes)
    index.insert(other.block_hashes)  # 14 blocks: the two deepest of `long` must go
    assert len(index) == 12
    assert index.match_length(long.block_hashes) == 8
    assert index.match_length(other.block_hashes) == 4


def test_a_prompt_the_replica_refused_is_taken_back_from_its_index() -> None:
    """vLLM refuses a prompt past its context (a 4xx) before prefilling any of it: the index
    drops the blocks the prompt added, keeps the history it extended, and gets back what
    making room for it evicted."""
    pool = PoolState("p", PoolPolicy(model="m", replicas=["http://a:1"]))
    pool.router.size_index("a:1", 40)  # 50 blocks remembered
    history = b"an earlier turn of the conversation " * 40  # ~11 blocks
    others = [f"another conversation {i} ".encode() * 40 for i in range(3)]

    def sent(text: bytes, *, refused: bool = False) -> RequestFeatures:
        request = pool.router.features("m", lambda: CanonicalPrompt(text))
        decision = pool.decide(request)
        assert decision is not None
        dispatch = pool.begin(decision, request)
        dispatch.refused = dispatch.rejected = refused
        pool.end(dispatch)
        return request

    kept = [sent(text) for text in [history, *others]]
    too_long = sent(history + b"a document pasted whole " * 400, refused=True)

    assert pool.router.estimated_cached_bytes("a:1", too_long) == len(history) // 128 * 128
    for request in kept:
        assert pool.router.estimated_cached_bytes("a:1", request) == request.hashed_bytes


def test_a_refused_prompt_stays_recorded_once_another_was_recorded_after_it() -> None:
    """A prompt recorded since may share the blocks the refused one added (a system prompt it
    brought to the replica first), and the engine holds that one's: nothing is taken back."""
    index = PrefixIndex(capacity=12, layout=FIXED)
    refused = fingerprint("m", b"s" * 128 * 3 + b"a" * 128 * 3, FIXED, 256)
    served = fingerprint("m", b"s" * 128 * 3 + b"b" * 128 * 5, FIXED, 256)
    recorded = Recorded(index.match_length(refused.block_hashes))
    index.insert(refused.block_hashes, recorded.evicted)
    recorded.version = index.version
    index.insert(served.block_hashes)

    assert index.take_back(refused.block_hashes, recorded) == 0
    assert index.match_length(served.block_hashes[:3]) == 3
    assert index.size == 11


def test_index_resize_and_clear() -> None:
    index = PrefixIndex(capacity=100, layout=FIXED)
    f = fingerprint("m", b"q" * 128 * 10, FIXED, 256)
    index.insert(f.block_hashes)
    index.resize(3)
    assert index.match_length(f.block_hashes) == 3
    index.clear()
    assert index.match_length(f.block_hashes) == 0


def test_the_home_follows_the_whole_system_prompt_not_its_opening() -> None:
    opening = "You are a helpful assistant for ACME Corp. Follow the policies below. " * 8
    support = {"role": "system", "content": opening + "You handle refunds and returns. " * 20}
    sales = {"role": "system", "content": opening + "You qualify sales leads politely. " * 20}
    question = {"role": "user", "content": "hello"}
    other_question = {"role": "user", "content": "a different question entirely " * 10}
    assert chat_features([support, question]).home_key != chat_features([sales, question]).home_key
    assert (
        chat_features([support, question]).home_key
        == chat_features([support, other_question]).home_key
    )


def test_without_a_system_prompt_the_home_is_the_first_block() -> None:
    features = chat_features([{"role": "user", "content": "x" * 1000}])
    assert features.home_key == features.block_hashes[0]


@pytest.mark.parametrize(
    ("blocks", "end"),
    [(0, 0), (1, 128), (16, 2048), (17, 2048 + 256), (32, 2048 + 4096), (48, 14336)],
)
def test_doubling_blocks_end_where_the_layout_says(blocks: int, end: int) -> None:
    assert DOUBLING.end(blocks) == end
    assert DOUBLING.blocks_within(end) == blocks
    assert DOUBLING.blocks_within(end + 1) == blocks  # a partial block is not a whole one
    assert DOUBLING.floor(end + 100) == end


def test_a_long_prompt_is_hashed_whole_in_few_blocks() -> None:
    text = bytes(range(256)) * (220 * 4)  # 220 KB
    hashes = block_hashes(text, 0, DOUBLING, 4096)
    assert 100 <= len(hashes) <= 120  # fixed 128-byte blocks would be 1,760
    assert DOUBLING.end(len(hashes) - 1) < len(text) <= DOUBLING.end(len(hashes))


def test_doubling_blocks_tell_apart_prompts_differing_only_near_the_end() -> None:
    common = b"history " * 25_000  # 200 KB of shared conversation
    a = block_hashes(common + b"one more question", 0, DOUBLING, 4096)
    b = block_hashes(common + b"another question!", 0, DOUBLING, 4096)
    assert a[-1] != b[-1]
    shared = DOUBLING.blocks_within(len(common))
    assert a[:shared] == b[:shared]
    # The shared history is matched to within one block: a few percent of its length.
    assert len(common) - DOUBLING.end(shared) < len(common) / 16


def test_the_index_counts_capacity_in_first_block_units() -> None:
    index = PrefixIndex(capacity=40, layout=DOUBLING)
    features = fingerprint("m", b"w" * DOUBLING.end(20), DOUBLING, 4096)
    index.insert(features.block_hashes)
    assert index.size == 16 + 4 * 2  # 16 blocks of one unit, then 4 of two
    index.resize(20)  # the deepest blocks go first, two units each
    assert index.match_length(features.block_hashes) == 18
