"""Specification of training the learned tier model and of its tooling (bench/tier_eval/):
training separates a tiny labelled set, lets request features decay on their own, needs both
labels and also sees a share of prompts as two-turn conversations; `llm-gateway tiers train` and
`tiers eval` run end to end, report a bad file and rebuild the shipped model from the shipped data;
the own set's report counts each category's prompts sent large; and the data build script labels
each public source by its category."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.tier_eval.conversations import EVAL_FOLLOW_UPS, TRAIN_FOLLOW_UPS, conversations
from bench.tier_eval.evaluation import Example
from bench.tier_eval.tiers_cli import SPLITS, build_parser, category_report
from bench.tier_eval.train import TrainConfig, train
from router_policies.tier_classifier_learned import LearnedTierModel
from tests.command_line import parsed
from tests.tier_learning import SHIPPED, TINY, tiny_examples

# --- training -----------------------------------------------------------------------------------


def test_training_on_a_tiny_dataset_separates_it() -> None:
    model = train(tiny_examples(), TrainConfig(min_df=1, iterations=200))
    hard = [model.score(e.body).score for e in tiny_examples() if e.hard]
    easy = [model.score(e.body).score for e in tiny_examples() if not e.hard]
    assert min(hard) > max(easy)
    assert model.meta["examples"] == len(TINY)


def test_request_features_decay_on_their_own() -> None:
    def largest(model: LearnedTierModel, request: bool) -> float:
        found = [abs(w) for f, w in model.weights.items() if isinstance(f, str) == request]
        return max(found, default=0.0)

    config = TrainConfig(min_df=1, iterations=200, l2=1e-4, l2_request=1e-4)
    loose = train(tiny_examples(), config)
    tight = train(tiny_examples(), dataclasses.replace(config, l2_request=1.0))
    assert largest(tight, request=True) < largest(loose, request=True) / 2
    assert largest(tight, request=False) > largest(loose, request=False) / 2
    assert tight.meta["l2_request"] == 1.0


def test_training_needs_both_labels() -> None:
    only_hard = [e for e in tiny_examples() if e.hard]
    with pytest.raises(ValueError, match="both easy and hard"):
        train(only_hard)


def test_training_also_sees_a_share_of_prompts_as_two_turn_conversations() -> None:
    examples = tiny_examples()
    made = conversations(examples, TRAIN_FOLLOW_UPS, 1.0, seed=3)
    assert [e.label for e in made] == [e.label for e in examples]
    for example, conversation in zip(examples, made, strict=True):
        first, reply, follow_up = conversation.body["messages"][-3:]
        assert first == example.body["messages"][-1] and reply["role"] == "assistant"
        assert follow_up["content"] in TRAIN_FOLLOW_UPS
    assert not set(TRAIN_FOLLOW_UPS) & set(EVAL_FOLLOW_UPS)  # the evaluation's are unseen
    model = train(examples, TrainConfig(min_df=1, conversation_share=0.5))
    assert model.meta["examples"] == len(examples) and model.meta["conversations"] > 0


# --- `llm-gateway tiers train` and `tiers eval`, end to end -----------------------------------


def write_jsonl(path: Path, examples: list[Example]) -> None:
    with path.open("w") as f:
        for e in examples:
            record = {"id": e.id, "label": e.label, "category": e.category}
            f.write(json.dumps({**record, "source": e.source, "body": e.body}) + "\n")


def test_tiers_train_and_eval_run_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "tiny.jsonl"
    write_jsonl(data, tiny_examples())
    model = tmp_path / "model.json.gz"
    cli = [sys.executable, "-m", "gateway.cli", "tiers"]
    trained = subprocess.run(
        [*cli, "train", str(data), "--out", str(model), "--min-df", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "trained on 12 prompts (6 hard)" in trained.stdout
    assert LearnedTierModel.load(model).meta["examples"] == 12

    # Every source the held-out splits name, each with both labels.
    folder = tmp_path / "public"
    folder.mkdir()
    for name in {s for _, a, b in SPLITS for s in (*a, *b)}:
        write_jsonl(folder / f"{name}.jsonl", [
            Example(id=f"{name}-{e.id}", label=e.label, category=e.category, body=e.body,
                    source=name)
            for e in tiny_examples()
        ])  # fmt: skip
    evaluated = subprocess.run(
        [*cli, "eval", "--model", str(model), "--train-data", str(folder), "--own", str(data),
         "--min-df", "1", "--no-timing"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    out = evaluated.stdout
    assert "Cross-source held-out splits" in out and "own set" in out
    assert out.count("| learned |") >= 2 and out.count("| cue |") >= 2


def test_the_own_set_report_counts_each_categorys_prompts_sent_large() -> None:
    examples = tiny_examples()
    model = train(examples, TrainConfig(min_df=1))
    pairs = {(e.category, e.label) for e in examples}

    def rows(threshold: float) -> dict[tuple[str, str], tuple[int, int]]:
        table = [line.split("|") for line in category_report(model, examples, threshold)]
        return {(r[1].strip(), r[2].strip()): (int(r[3]), int(r[4])) for r in table[4:]}

    everything, nothing = rows(0.0), rows(1.0)  # a score is strictly between 0 and 1
    assert everything.keys() == nothing.keys() == pairs
    assert all(n == sent for n, sent in everything.values())
    assert all(sent == 0 for _, sent in nothing.values())
    assert sum(n for n, _ in everything.values()) == len(examples)


def test_the_shipped_model_is_rebuilt_byte_for_byte_from_the_shipped_data(tmp_path: Path) -> None:
    """The command in docs/tier-eval.md; string hashing differs per process, the model must not."""
    root = Path(__file__).parent.parent
    data = sorted(str(p) for p in (root / "bench/data/tier_train").glob("*.jsonl"))
    out = tmp_path / "rebuilt.json.gz"
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "tiers", "train", *data, "--out", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "7"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rebuilt = LearnedTierModel.load(out)
    # Byte for byte on the same numpy; within rounding on another build of it.
    assert rebuilt.bias == pytest.approx(SHIPPED.bias, abs=1e-4)
    assert len(rebuilt.weights.keys() ^ SHIPPED.weights.keys()) <= len(SHIPPED.weights) // 100
    common = rebuilt.weights.keys() & SHIPPED.weights.keys()
    assert max(abs(rebuilt.weights[f] - SHIPPED.weights[f]) for f in common) < 1e-3


def test_tiers_train_reports_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"label": "medium", "body": {"messages": []}}\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "tiers", "train", str(bad), "--out",
         str(tmp_path / "m.json.gz")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "label must be one of" in result.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--iterations", "0"),
        ("--iterations", "-3"),
        ("--max-features", "-1"),
        ("--max-features", "0"),
        ("--min-df", "0"),
        ("--l2", "-1"),
        ("--l2-request", "nan"),
        ("--conversation-share", "5"),
        ("--conversation-share", "-0.1"),
    ],
)
@pytest.mark.parametrize("command", ["train", "eval"])
def test_tiers_refuses_options_that_train_nothing(command: str, flag: str, value: str) -> None:
    # Before: --iterations 0 or --max-features -1 wrote a model of 0 weights, with exit 0.
    data = ["data.jsonl", "--out", "m.json.gz"] if command == "train" else []
    ran = parsed(build_parser(), command, *data, flag, value)
    assert ran.refused(f"argument {flag}", value), ran.err


# --- the data build script ------------------------------------------------------------------


def test_build_data_labels_each_source_by_category(tmp_path: Path) -> None:
    from bench.tier_eval.build_data import MATH_DRILL_MODULES, build

    raw = tmp_path / "raw"
    (raw / "t0").mkdir(parents=True)

    def lines(name: str, rows: list[dict[str, Any]]) -> None:
        (raw / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    lines("gsm8k_train.jsonl", [{"question": "Tom has 3 apples...", "answer": "#### 3"}])
    lines("math_test.jsonl", [{"problem": "Solve $x^2=4$.", "type": "Algebra", "level": "1"}])
    with gzip.open(raw / "HumanEval.jsonl.gz", "wt") as f:
        f.write(json.dumps({"prompt": "def f(x):\n    '''double x'''\n"}) + "\n")
    lines("mbpp.jsonl", [{"text": "Write a function to add.", "test_list": ["assert f(1)==2"]}])
    lines("selfinstruct_seed_tasks.jsonl", [
        {"name": "python_sorting", "instruction": "Sort this in Python.", "instances": [{"input": "[3,1]"}]},
        {"name": "cover_letter", "instruction": "Write a cover letter.", "instances": [{"input": ""}]},
    ])  # fmt: skip
    (raw / "theoremqa_test.json").write_text(json.dumps([
        {"Question": "Is 7 prime?", "field": "Math", "Picture": None},
        {"Question": "See the figure.", "field": "Math", "Picture": "a.png"},
    ]))  # fmt: skip
    lines("nq_open_dev.jsonl", [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}])
    (raw / "clinc_data_full.json").write_text(json.dumps({"train": [["set a timer", "timer"]]}))
    (raw / "banking77_train.csv").write_text("text,category\nWhere is my card?,card_arrival\n")
    lines("t0/duorc_answer.jsonl", [{"prompt": "Answer from the plot: ...", "completion": "x"}])
    lines("t0/quoref_answer.jsonl", [{"prompt": "Who is ...?", "completion": "y"}])
    lines("t0/samsum_summary.jsonl", [{"prompt": "Not redistributable", "completion": "z"}])
    (raw / "acpbench" / "app").mkdir(parents=True)
    ferry = {"context": "This is a ferry domain.", "question": "Can it sail?", "group": "app_bool"}
    blocks = {"context": "This is a blocksworld domain.", "question": "Pick up b1?", "group": "g"}
    (raw / "acpbench" / "app" / "dev.bool.json").write_text(json.dumps([ferry, ferry, blocks]))
    (raw / "prontoqa_dev.json").write_text(
        json.dumps([{"context": "Max is a wumpus.", "question": "Is Max red?"}])
    )
    proof = {"context": "Bob is red. Red things are big.", "question": "Bob is big?"}
    (raw / "proofwriter_train.json").write_text(json.dumps([proof, proof]))
    (raw / "multilogieval" / "d1_Data" / "pl").mkdir(parents=True)
    rules = {
        "logic": "pl",
        "depth": "d1",
        "samples": [{"context": "If it rains, it\u2019s wet.", "question": "Is it wet?"}],
    }
    (raw / "multilogieval" / "d1_Data" / "pl" / "MP.json").write_bytes(
        json.dumps(rules, ensure_ascii=False).encode("cp1252")
    )
    drills = raw / "mathematics" / "train-easy"
    drills.mkdir(parents=True)
    for module in MATH_DRILL_MODULES:  # the generator's files: a question line, an answer line
        drills.joinpath(f"{module}.txt").write_text(f"What is {module}?\n1\nAgain {module}?\n2\n")
    sort = {"intent": "sort list `x` in reverse order", "code": "x.sort(reverse=True)"}
    (raw / "conala_train.json").write_text(json.dumps([sort, sort]))
    (raw / "conala_test.json").write_text(json.dumps([{"intent": "trim `s`", "code": "s.strip()"}]))

    out = tmp_path / "out"
    counts = build(raw, out)
    assert counts["theoremqa"] == 1  # the question with a picture is left out
    # PlanBench's domains (held out) are not trained on; a repeated question counts once
    assert counts["acpbench"] == 1
    assert counts["p3_a"] == counts["p3_b"] == 1  # samsum is in neither part
    assert counts["conala"] == 2  # train and test, a repeated intent once
    assert counts["proofwriter"] == 1  # a repeated problem once
    # The drills' questions, not their answers; arithmetic and comparisons in part A only
    arithmetic = sum(m.startswith(("arithmetic__", "comparison__")) for m in MATH_DRILL_MODULES)
    assert counts["math_drills_a"] == 2 * arithmetic
    assert counts["math_drills_b"] == 2 * (len(MATH_DRILL_MODULES) - arithmetic)

    def records(name: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in (out / f"{name}.jsonl").read_text().splitlines()]

    for name in ("gsm8k", "math", "humaneval", "mbpp", "theoremqa", "acpbench", "prontoqa",
                 "multilogieval", "proofwriter"):  # fmt: skip
        assert {r["label"] for r in records(name)} == {"hard"}, name
    assert records("multilogieval")[0]["body"]["messages"][0]["content"] == (
        "If it rains, it\u2019s wet.\n\nIs it wet?"  # read from a cp1252 file
    )
    for name in ("nq_open", "clinc", "banking77", "p3_a", "p3_b", "conala", "math_drills_a",
                 "math_drills_b"):  # fmt: skip
        assert {r["label"] for r in records(name)} == {"easy"}, name
    asked = {r["body"]["messages"][0]["content"] for r in records("math_drills_a")}
    assert "What is arithmetic__mul?" in asked and not any(a.isdigit() for a in asked)
    seed = {r["body"]["messages"][0]["content"]: r["label"] for r in records("selfinstruct_seed")}
    assert seed == {"Sort this in Python.\n\n[3,1]": "hard", "Write a cover letter.": "easy"}
    assert records("nq_open")[0]["body"]["messages"][0]["content"] == "Who wrote hamlet?"
