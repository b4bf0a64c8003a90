"""A conversation is scored by its task, its first and latest user messages, and keeps its tier:
once it has gone large, its later turns stay large even where those two read as easy (an
upgrade is always allowed); a dry run remembers nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router_policies.schema import InvalidPolicy
from router_policies.tier_memory import conversation_keys
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierSettings
from router_policies.tiers import Tier
from tests.tiers import EASY_FOLLOW_UP as EASY
from tests.tiers import HARD, OPENING, as_responses, conversation_key, dialogue, follow_up


def router(**settings: Any) -> TierRouter:
    return TierRouter("auto", TierSettings(small="small", large="large", **settings))


def test_a_follow_up_is_scored_with_the_conversations_first_message() -> None:
    forgetful = router(conversation_memory=0)
    # Read alone, the follow-up is easy; the task is the first turn's.
    assert forgetful.classify(dialogue(EASY)).tier is Tier.SMALL
    assert forgetful.classify(dialogue(HARD, EASY)).tier is Tier.LARGE
    # The turns between the first and the latest are not read.
    assert forgetful.classify(dialogue(OPENING, HARD, EASY)).tier is Tier.SMALL


def test_a_conversation_that_went_large_stays_large_for_its_later_turns() -> None:
    tiers = router()
    assert tiers.classify(dialogue(OPENING, EASY)).tier is Tier.SMALL
    went = tiers.classify(dialogue(OPENING, HARD))
    assert went.tier is Tier.LARGE and not went.kept
    tiers.observe(went, sent_large=True)
    later = tiers.classify(dialogue(OPENING, HARD, EASY))
    assert later.tier is Tier.LARGE and later.kept
    assert tiers.classify(dialogue("Hi there.", EASY)).tier is Tier.SMALL  # another conversation


def test_a_conversation_may_go_large_later_but_never_back() -> None:
    tiers = router()
    first = tiers.classify(dialogue(EASY))
    tiers.observe(first, sent_large=False)
    assert first.tier is Tier.SMALL
    harder = tiers.classify(dialogue(EASY, HARD))
    assert harder.tier is Tier.LARGE
    tiers.observe(harder, sent_large=True)
    assert tiers.classify(dialogue(EASY, HARD, EASY)).tier is Tier.LARGE


def test_a_large_verdict_a_close_call_sent_small_is_not_remembered() -> None:
    tiers = router()
    went = tiers.classify(dialogue(OPENING, HARD))
    assert went.tier is Tier.LARGE
    tiers.observe(went, sent_large=False)  # its history is cached in the small pool
    later = tiers.classify(dialogue(OPENING, HARD, EASY))
    assert later.tier is Tier.SMALL and not later.kept


def test_a_dry_run_remembers_nothing_and_memory_zero_scores_every_turn_alone() -> None:
    tiers = router()
    tiers.classify(dialogue(OPENING, HARD))  # as POST /admin/route does: never observed
    assert tiers.classify(dialogue(OPENING, HARD, EASY)).tier is Tier.SMALL
    forgetful = router(conversation_memory=0)
    forgetful.observe(forgetful.classify(dialogue(OPENING, HARD)), sent_large=True)
    assert forgetful.classify(dialogue(OPENING, HARD, EASY)).tier is Tier.SMALL


def test_a_conversation_is_known_by_its_messages_through_each_one_from_its_opening() -> None:
    opening = conversation_key(dialogue(HARD))  # its lead and first user message
    assert conversation_keys(dialogue(HARD)) == (opening,)
    second = conversation_keys(dialogue(HARD, EASY))
    later = conversation_keys(dialogue(HARD, EASY, EASY))
    assert second is not None and len(second) == 3  # the opening, the answer, the next turn
    assert later is not None and later[:3] == second  # each turn resends the one before
    assert len(set(later)) == len(later) == 5
    assert conversation_key(dialogue(HARD)) != conversation_key(dialogue(EASY))
    assert conversation_key({"prompt": "a completion"}) is None
    assert conversation_key({"messages": [{"role": "system", "content": "no user"}]}) is None


def test_whatever_follows_the_first_user_message_makes_a_follow_up() -> None:
    assert follow_up(dialogue(OPENING, HARD)) and follow_up(dialogue(OPENING, HARD, EASY))
    assert not follow_up(dialogue(OPENING)) and not follow_up({"prompt": "a completion"})
    system, user = dialogue(HARD)["messages"]

    def tool_call(call_id: str) -> dict[str, Any]:
        function = {"name": "search", "arguments": "{}"}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }

    call, other_call = tool_call("c1"), tool_call("c2")
    result = {"role": "tool", "tool_call_id": "c1", "content": "found"}
    assert follow_up({"messages": [system, user, call, result]})
    assert conversation_key({"messages": [system, user, call, result]}) != conversation_key(
        {"messages": [system, user, other_call, result]}
    )
    reply = {"role": "assistant", "content": "ok"}
    assert follow_up(as_responses({"messages": [system, user, reply]}))


def test_a_conversation_is_known_whatever_the_spacing_of_its_tool_calls_arguments() -> None:
    """vLLM parses a call's arguments before the template renders them: a client that re-dumps
    its history between turns continues the same conversation, unless the keys' order moved."""
    system, user = dialogue(HARD)["messages"]

    def called(arguments: str) -> int | None:
        function = {"name": "search", "arguments": arguments}
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": function}],
        }
        result = {"role": "tool", "tool_call_id": "c1", "content": "found"}
        return conversation_key({"messages": [system, user, call, result]})

    spaced = called('{"q": "rust", "n": 3}')
    assert spaced == called('{"q":"rust","n":3}')
    assert spaced != called('{"n": 3, "q": "rust"}')


def answered(answer: str, *users: str) -> dict[str, Any]:
    """A conversation whose first user turn got ``answer``, then ``users``' turns."""
    system, first = dialogue(OPENING)["messages"]
    rest = dialogue(*users)["messages"][1:]
    return {"messages": [system, first, {"role": "assistant", "content": answer}, *rest]}


def test_a_first_turn_continues_nothing_so_no_other_conversation_keeps_it_large() -> None:
    tiers = router()
    tiers.observe(tiers.classify(dialogue(OPENING)), sent_large=False)
    went = tiers.classify(dialogue(OPENING, HARD))
    assert went.tier is Tier.LARGE
    tiers.observe(went, sent_large=True)
    # Someone else opens alike: a new conversation, scored alone.
    another = tiers.classify(dialogue(OPENING))
    assert another.tier is Tier.SMALL and not another.kept
    # Nor where its opening itself is remembered (an instance of an earlier release, which
    # knew conversations by their opening alone, tells of one that went large on turn 2).
    opening = conversation_key(dialogue(OPENING))
    assert opening is not None
    tiers.remember(opening)
    assert not tiers.classify(dialogue(OPENING)).kept


def test_conversations_that_open_alike_are_told_apart_by_their_first_answer() -> None:
    tiers = router()
    went = tiers.classify(answered("Hello! How can I help?", HARD))
    assert went.tier is Tier.LARGE
    tiers.observe(went, sent_large=True)
    other = tiers.classify(answered("Hi, what do you need?", EASY))
    assert other.tier is Tier.SMALL and not other.kept
    later = tiers.classify(answered("Hello! How can I help?", HARD, EASY))
    assert later.tier is Tier.LARGE and later.kept


def test_conversations_answered_alike_are_told_apart_by_what_they_ask_next() -> None:
    # A greedy model greets everyone alike: the answer does not tell two users apart.
    tiers = router()
    went = tiers.classify(answered("Hello! How can I help?", HARD))
    assert went.tier is Tier.LARGE
    tiers.observe(went, sent_large=True)
    other = tiers.classify(answered("Hello! How can I help?", EASY))
    assert other.tier is Tier.SMALL and not other.kept
    later = tiers.classify(answered("Hello! How can I help?", EASY, EASY))
    assert later.tier is Tier.SMALL and not later.kept
    own = tiers.classify(answered("Hello! How can I help?", HARD, EASY))
    assert own.tier is Tier.LARGE and own.kept


def test_a_conversation_is_remembered_under_one_key_refreshed_at_each_later_large_turn() -> None:
    # One key: not one per turn, which would crowd other conversations out of the memory; and
    # remembered again at each turn, which keeps it in the memory and in the shared state.
    tiers = router()
    went = tiers.classify(dialogue(OPENING, HARD))
    assert tiers.observe(went, sent_large=True) == went.conversation
    for turns in (EASY, HARD):
        verdict = tiers.classify(dialogue(OPENING, HARD, EASY, turns))
        assert verdict.tier is Tier.LARGE and verdict.conversation == went.conversation
        assert tiers.observe(verdict, sent_large=True) == went.conversation  # told again
    assert len(tiers.conversations) == 1


def test_a_conversation_that_went_large_on_its_first_turn_is_known_by_its_opening() -> None:
    # Its answer was not written when it went large; its follow-up carries it.
    tiers = router()
    first = tiers.classify(dialogue(HARD))
    tiers.observe(first, sent_large=True)
    assert first.conversation == conversation_key(dialogue(HARD))
    follow = conversation_keys(dialogue(HARD, EASY))
    assert follow is not None and tiers.conversations.any_went_large(follow)
    assert not tiers.conversations.any_went_large((follow[0],))  # a first turn never is


def test_a_responses_api_conversation_is_scored_and_remembered_as_the_same_chat() -> None:
    chat = dialogue(OPENING, HARD, EASY)
    assert conversation_key(as_responses(chat)) == conversation_key(chat)
    assert follow_up(as_responses(chat)) and not follow_up({"input": HARD})
    assert router().classify(as_responses(dialogue(EASY))).tier is Tier.SMALL
    assert router().classify({"input": HARD}).tier is Tier.LARGE  # a bare string is a user turn
    tiers = router()
    went = tiers.classify(as_responses(dialogue(OPENING, HARD)))
    assert went.tier is Tier.LARGE
    tiers.observe(went, sent_large=True)
    later = tiers.classify(as_responses(dialogue(OPENING, HARD, EASY)))
    assert later.tier is Tier.LARGE and later.kept


def as_text_part(chat: dict[str, Any], part_type: str = "text") -> dict[str, Any]:
    """The same conversation with its first user message sent as one text part."""
    system, first, *rest = chat["messages"]
    part = {**first, "content": [{"type": part_type, "text": first["content"]}]}
    return {"messages": [system, part, *rest]}


def test_a_first_message_sent_as_one_text_part_is_the_same_conversation() -> None:
    chat = dialogue(OPENING, HARD, EASY)
    assert conversation_key(as_text_part(chat)) == conversation_key(chat)
    responses = as_responses(as_text_part(chat, "input_text"))
    assert conversation_key(responses) == conversation_key(chat)
    # As prefix routing reads content (router_policies/fingerprint.py): text parts by their
    # text, anything else by its JSON, so an image makes another conversation.
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    first = chat["messages"][1]
    with_image = {"messages": [{**first, "content": [image, {"type": "text", "text": OPENING}]}]}
    assert conversation_key(with_image) != conversation_key({"messages": [first]})
    # Remembered as large on one spelling, kept large on the other.
    tiers = router()
    tiers.observe(tiers.classify(dialogue(OPENING, HARD)), sent_large=True)
    later = tiers.classify(as_text_part(dialogue(OPENING, HARD, EASY)))
    assert later.tier is Tier.LARGE and later.kept


def test_a_reload_that_fails_leaves_the_running_tiers_memory_as_it_was(tmp_path: Path) -> None:
    not_a_model = tmp_path / "tiers.json.gz"
    not_a_model.write_bytes(b"not gzip")
    running = router()
    went = running.classify(dialogue(OPENING, HARD))
    running.observe(went, sent_large=True)
    with pytest.raises(InvalidPolicy):
        TierRouter(
            "auto",
            TierSettings(
                small="small", large="large", conversation_memory=0, model=str(not_a_model)
            ),
            previous=running,
        )
    assert running.classify(dialogue(OPENING, HARD, EASY)).kept
