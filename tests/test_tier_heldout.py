"""The public held-out sets of the tier classifiers: conversations cut where a follow-up can
hide the task, no prompt shared with the training sets, every source in the report."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.tier_eval.build_heldout import DIALOGUES, REASONING, SOURCES, cut
from bench.tier_eval.tiers_cli import HELDOUT_DATA, TRAIN_DATA, heldout_report
from router_policies.tier_classifiers import load_learned


def test_a_dialogue_is_cut_after_a_user_turn_from_the_second_on() -> None:
    turns = [("user", "book a table"), ("user", "for two"), ("assistant", "where?"),
             ("user", "Soho"), ("assistant", "done"), ("user", "thanks"), ("assistant", "bye")]  # fmt: skip
    cuts = {len(m) for m in (cut(turns, random.Random(seed)) for seed in range(20)) if m}
    assert cuts == {3, 5}  # after "Soho" or "thanks": never the first turn, never the assistant
    first = cut(turns, random.Random(0))
    assert first is not None and first[0] == {"role": "user", "content": "book a table\nfor two"}


def test_a_dialogue_with_one_user_turn_is_not_a_conversation() -> None:
    assert cut([("user", "hi"), ("assistant", "hello"), ("user", "  ")], random.Random(0)) is None


def _user_texts(path: Path) -> set[str]:
    texts = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        for message in json.loads(line)["body"]["messages"]:
            if message["role"] == "user":
                texts.add(message["content"])
    return texts


def test_the_held_out_sets_share_no_prompt_with_the_training_sets() -> None:
    trained = set().union(*(_user_texts(p) for p in TRAIN_DATA.glob("*.jsonl")))
    for name in SOURCES:
        assert not _user_texts(HELDOUT_DATA / f"{name}.jsonl") & trained, name


def test_the_report_scores_every_held_out_source_with_both_classifiers_and_length_alone() -> None:
    lines = heldout_report(load_learned(None), HELDOUT_DATA)
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line]
    named = {row[0].lstrip("| ") for row in rows[1:]}
    assert all(any(source in name for name in named) for source in (*REASONING, *DIALOGUES))
    assert {row[1] for row in rows[1:]} == {"learned", "cue", "length alone"}
    assert all(0.0 <= float(row[4]) <= 1.0 for row in rows[1:])
    assert all(0.0 <= float(row[5]) < 0.1 for row in rows[1:])  # the AUC's standard error
