"""Specification of the learned tier model's features (router_policies/tier_classifier_learned.py):
lower-cased words with digits collapsed, punctuation marks of their own but no sentence
punctuation, a conversation read by its first and latest user messages with the task's length
kept apart from the follow-up's, the sentences the task is told in, named request features
(tools, structured output, max_tokens, turns), only the head and tail of a long message read,
and feature names that round-trip."""

from __future__ import annotations

from typing import Any

import pytest

from router_policies.tier_classifier_learned import (
    SCAN_HEAD,
    SCAN_TAIL,
    feature_name,
    features,
    parse_feature,
)
from tests.tiers import chat, dialogue

# --- features -----------------------------------------------------------------------------------


def test_words_are_lower_cased_and_digits_collapse() -> None:
    text, _ = features(chat("Sold 48 Clips in April"))
    assert {b"sold", b"00", b"clips", b"in", b"april"} <= text


def test_punctuation_marks_are_features_of_their_own() -> None:
    text, _ = features(chat("f(x) = x^2 + $y$"))
    assert {ord(c) for c in "()=^+$"} <= text
    assert b"f" in text and b"x" in text


def test_sentence_punctuation_is_no_feature() -> None:
    """A full stop or a question mark is the style of a data set, not a sign of difficulty."""
    text, _ = features(chat('Hi there. "Really?" Yes, really: fine; go!'))
    assert text == {b"hi", b"there", b"really", b"yes", b"fine", b"go"}


def test_a_conversation_is_read_by_its_first_and_latest_user_messages() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "prove the theorem"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "middle turn"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "now shorter"},
        ]
    }
    text, meta = features(body)
    assert text == {b"prove", b"the", b"theorem", b"now", b"shorter"}
    # The task's length is its first message's ("prove the theorem", 17 characters); the
    # follow-up's ("now shorter", 11) is a feature of its own.
    assert [m for m in meta if m.startswith(("#len", "#latest_len"))] == ["#len:2", "#latest_len:2"]


def test_a_short_follow_up_does_not_make_a_long_task_look_short() -> None:
    task = "Prove the following statement about graphs in full detail. " * 20
    alone = features(chat(task))[1]
    followed = features(dialogue(task, "Why?"))[1]
    [length] = [m for m in alone if m.startswith("#len:")]
    assert length in followed
    assert "#latest_len:1" in followed
    assert not any(m.startswith("#latest_len") for m in alone)


def _sentences(body: dict[str, Any]) -> list[str]:
    return [m for m in features(body)[1] if m.startswith("#sentences:")]


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("What is the capital of France?", "#sentences:0"),
        ("What is the capital of France?  \n", "#sentences:0"),
        ("Pi is 3.14, roughly", "#sentences:0"),
        ("Anne is taller than Bob. Bob is taller than Carl. Who is the shortest?", "#sentences:2"),
        ("Facts:\nA is red.\nB is blue!\nIs C green?\nAnswer.", "#sentences:2"),
    ],
)
def test_the_sentences_a_task_is_told_in_are_counted(task: str, expected: str) -> None:
    """A chained problem states its facts one by one before it asks; a query is one sentence
    (a decimal point, or the text's last mark, white space after it or not, ends none)."""
    assert _sentences(chat(task)) == [expected]


def test_the_sentences_counted_are_the_tasks_not_a_follow_ups() -> None:
    task = "Anne is taller than Bob. Bob is taller than Carl. Who is the shortest?"
    assert _sentences(dialogue(task, "Why? Are you sure? Say it again. Slowly.")) == _sentences(
        chat(task)
    )
    assert _sentences(dialogue("Hello", "A is B. B is C. C is D. What is A?")) == ["#sentences:0"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "#tools"),
        ({"response_format": {"type": "json_object"}}, "#structured_output"),
        ({"max_tokens": 4096}, "#max_tokens:6"),
    ],
)
def test_request_features_are_named(extra: dict[str, Any], expected: str) -> None:
    _, meta = features(chat("hello", **extra))
    assert expected in meta


def test_turns_count_user_messages() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    }
    assert "#turns:2" in features(body)[1]


def test_only_the_head_and_tail_of_a_long_message_are_read() -> None:
    filler = "lorem ipsum " * 2000
    middle = len(filler) // 2
    with_word = filler[:middle] + " theorem " + filler[middle:]
    assert len(with_word) > SCAN_HEAD + SCAN_TAIL
    assert b"theorem" not in features(chat(with_word))[0]
    assert b"theorem" in features(chat("theorem " + filler))[0]
    assert b"theorem" in features(chat(filler + " theorem"))[0]


@pytest.mark.parametrize("name", ["python", "$", "\\", "#tools", "#len:3", "über", "#"])
def test_feature_names_round_trip(name: str) -> None:
    assert feature_name(parse_feature(name)) == name
