"""Specification of the learned tier classifier (router_policies/tier_classifier_learned.py),
of the policy's choice of classifier (router_policies/tier_classifiers.py), and of the
`llm-gateway tiers` tooling that trains and evaluates it (bench/tier_eval/)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from pydantic import ValidationError

from bench.launcher import start_gateway
from bench.tier_eval.conversations import EVAL_FOLLOW_UPS, TRAIN_FOLLOW_UPS, conversations
from bench.tier_eval.evaluation import Example
from bench.tier_eval.tiers_cli import SPLITS, category_report
from bench.tier_eval.train import TrainConfig, train
from replica.processes import ManagedProcess
from router_policies.schema import InvalidPolicy
from router_policies.tier_classifier_learned import (
    EXPLAIN_TOP,
    SCAN_HEAD,
    SCAN_TAIL,
    LearnedTierModel,
    feature_name,
    features,
    parse_feature,
)
from router_policies.tier_classifiers import CueClassifier, load_learned
from router_policies.tier_router import TierRouter
from router_policies.tier_settings import TierClassifierName, TierSettings
from tests.conftest import FAST_PROBES, running_sims
from tests.tiers import dialogue

SHIPPED = load_learned(None)


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}


# --- the shipped model ranks obvious cases -------------------------------------------------------

OBVIOUSLY_HARD = [
    "Find all real x such that $x^3 - 6x^2 + 11x - 6 = 0$ and prove there are no others.",
    "A train leaves at 3 pm going 60 mph; a second leaves at 4 pm going 80 mph. When does the "
    "second catch up, and how far from the station?",
    "Write a Python function that returns the longest palindromic substring of a string.",
    "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:\n"
    '    """Merge all overlapping intervals and return them sorted."""\n',
    "Compute the sum of all integers n < 1000 such that n^2 + 1 is divisible by 5.",
]
OBVIOUSLY_EASY = [
    "hi!",
    "Good morning! How are you today?",
    "thanks, that was really helpful :)",
    "Write a short, friendly email thanking my team for their work this week.",
    "What is the capital of Australia?",
    "Summarize this paragraph in one sentence: The meeting was moved to Thursday because "
    "several people were travelling, and the agenda stays the same.",
]


@pytest.mark.parametrize("hard", OBVIOUSLY_HARD)
@pytest.mark.parametrize("easy", OBVIOUSLY_EASY)
def test_obvious_maths_and_code_outscore_obvious_chit_chat(hard: str, easy: str) -> None:
    assert SHIPPED.score(chat(hard)).score > SHIPPED.score(chat(easy)).score


@pytest.mark.parametrize("text", OBVIOUSLY_HARD + OBVIOUSLY_EASY)
def test_score_is_strictly_between_zero_and_one(text: str) -> None:
    assert 0.0 < SHIPPED.score(chat(text)).score < 1.0


def test_an_empty_request_gets_a_score() -> None:
    assert 0.0 < SHIPPED.score({"messages": []}).score < 1.0
    assert 0.0 < SHIPPED.score({"prompt": "2+2"}).score < 1.0


# --- explanations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Prove that $\\sqrt{2}$ is irrational.", {"$", "\\", "prove", "irrational"}),
        ("Write a python function to reverse a linked list.", {"python", "function"}),
        ("hi there, how are you?", {"hi", "how", "you", "?"}),
    ],
)
def test_explanations_name_the_features_that_pushed_the_score(
    text: str, expected: set[str]
) -> None:
    result = SHIPPED.score(chat(text))
    named = set(result.contributions)
    assert named & expected, named
    assert len(named) <= EXPLAIN_TOP
    assert result.classifier == "learned"
    assert set(result.features) == named


def test_contributions_are_the_strongest_ones_and_add_up_with_the_bias() -> None:
    """With every feature explained (a short prompt), bias + contributions is the logit."""
    body = chat("solve x + 1 = 3")
    text, meta = features(body)
    assert len(text) + len(meta) <= EXPLAIN_TOP
    result = SHIPPED.score(body)
    logit = SHIPPED.bias + sum(result.contributions.values())
    assert abs(1 / (1 + math.exp(-logit)) - result.score) < 1e-3
    magnitudes = [abs(v) for v in result.contributions.values()]
    assert magnitudes == sorted(magnitudes, reverse=True)


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


# --- the model file -----------------------------------------------------------------------------


def test_model_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "m.json.gz"
    SHIPPED.save(path)
    loaded = LearnedTierModel.load(path)
    assert loaded.bias == pytest.approx(SHIPPED.bias)
    assert loaded.weights.keys() == SHIPPED.weights.keys()
    for text in OBVIOUSLY_HARD + OBVIOUSLY_EASY:
        assert loaded.score(chat(text)).score == pytest.approx(SHIPPED.score(chat(text)).score)


def test_saving_is_deterministic() -> None:
    assert SHIPPED.to_bytes() == LearnedTierModel.from_bytes(SHIPPED.to_bytes()).to_bytes()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not json", "not a tier model file"),
        (gzip.compress(b'{"format": "other"}'), "format"),
        (orjson.dumps({"format": "llm-gateway/tier-linear", "version": 99}), "version 99"),
        (orjson.dumps({"format": "llm-gateway/tier-linear", "version": 1}), "'bias'"),
    ],
)
def test_a_bad_model_file_is_rejected_with_the_reason(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=problem):
        LearnedTierModel.load(path)


def test_the_shipped_model_is_small() -> None:
    from importlib import resources

    data = resources.files("router_policies.models").joinpath("tier_default.json.gz").read_bytes()
    assert len(data) < 2 * 1024 * 1024


# --- training -----------------------------------------------------------------------------------

TINY = [
    ("hard", "gsm", "Tom has 3 apples and buys 5 more. How many apples does he have?"),
    ("hard", "gsm", "A shop sells pens at $2 each. How much do 7 pens cost?"),
    ("hard", "gsm", "If 4 workers build a wall in 6 days, how many days do 8 workers need?"),
    ("hard", "code", "Write a python function to check whether a number is prime."),
    ("hard", "code", "Write a python function to sort a list of tuples by the second item."),
    ("hard", "code", "def add(a, b):\n    '''Return the sum of a and b.'''\n"),
    ("easy", "chat", "Write a haiku about the sea."),
    ("easy", "chat", "Suggest a name for my new puppy."),
    ("easy", "chat", "Rewrite this sentence to sound more polite: send it now."),
    ("easy", "chat", "What is a good gift for my mother's birthday?"),
    ("easy", "chat", "Translate 'good morning' into French."),
    ("easy", "chat", "Tell me a fun fact about penguins."),
]


def tiny_examples() -> list[Example]:
    return [
        Example(id=f"t{i}", label=label, category=src, body=chat(text), source=src)
        for i, (label, src, text) in enumerate(TINY)
    ]


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


# --- choosing the classifier in the policy ----------------------------------------------------


def settings(**extra: Any) -> TierSettings:
    return TierSettings.model_validate({"small": "s", "large": "l", **extra})


def test_the_learned_model_is_the_default_and_the_cue_model_stays_selectable() -> None:
    # The learned model ranks held-out public prompts and the project's own set better
    # (docs/tier-eval.md); the cue model ranks real user prompts worse than chance.
    assert settings().classifier is TierClassifierName.LEARNED
    assert TierRouter("auto", settings()).classifier is SHIPPED
    assert isinstance(TierRouter("auto", settings(classifier="cue")).classifier, CueClassifier)


def test_learned_without_a_model_uses_the_shipped_one() -> None:
    router = TierRouter("auto", settings(classifier="learned"))
    assert router.classifier is SHIPPED
    verdict = router.classify(chat("Prove that there are infinitely many primes."))
    assert verdict.score.classifier == "learned"


def test_learned_with_a_model_file_uses_it(tmp_path: Path) -> None:
    path = tmp_path / "mine.json.gz"
    train(tiny_examples(), TrainConfig(min_df=1)).save(path)
    router = TierRouter("auto", settings(classifier="learned", model=str(path)))
    assert isinstance(router.classifier, LearnedTierModel)
    assert router.classifier.meta["examples"] == len(TINY)


def test_a_missing_model_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no file"):
        settings(classifier="learned", model=str(tmp_path / "nope.json.gz"))


def test_a_model_file_that_does_not_load_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not a model")
    with pytest.raises(InvalidPolicy, match=r"tiers\.auto\.model: .*not a tier model file"):
        TierRouter("auto", settings(classifier="learned", model=str(bad)))


@pytest.mark.parametrize(
    "bad",
    [{"classifier": "neural"}, {"model": "m.json.gz"}, {"classifier": "cue", "model": "m.json.gz"}],
)
def test_bad_classifier_settings_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        settings(**bad)


def test_calibration_survives_a_reload_with_the_same_model_but_not_a_switch() -> None:
    calibrated = {"calibration": {"target_large_share": 0.3, "min_samples": 10}}
    first = TierRouter("auto", settings(classifier="learned", **calibrated))
    for text in OBVIOUSLY_HARD + OBVIOUSLY_EASY:
        first.observe(first.classify(chat(text)), sent_large=False)  # the calibration only
    same = TierRouter("auto", settings(classifier="learned", **calibrated), previous=first)
    assert same.threshold == first.threshold
    switched = TierRouter("auto", settings(classifier="cue", **calibrated), previous=first)
    assert switched._calibrator is not first._calibrator


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


# --- /admin/route explains the learned model's decision ---------------------------------------

TOKEN = "tier-test-token"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def learned_gateway() -> AsyncIterator[ManagedProcess]:
    async with (
        running_sims(1, "small-model") as [small],
        running_sims(1, "large-model") as [large],
    ):
        policy = {
            "pools": {
                "small": {"model": "small-model", "replicas": [small.url]},
                "large": {"model": "large-model", "replicas": [large.url]},
            },
            "tiers": {"auto": {"small": "small", "large": "large", "classifier": "learned"}},
        }
        gw = await start_gateway(policy, env={**FAST_PROBES, "GATEWAY_ADMIN_TOKEN": TOKEN})
        yield gw
        await gw.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_admin_route_shows_the_learned_score_threshold_and_contributions(
    learned_gateway: ManagedProcess,
) -> None:
    body = chat("Prove that $\\sqrt{2}$ is irrational.")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{learned_gateway.url}/admin/route",
            data=orjson.dumps(body),
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        tier = (await response.json())["tier"]
    assert tier["classifier"] == "learned"
    assert tier["score"] > tier["threshold"] == 0.5
    assert tier["tier"] == "large"
    assert 0 < len(tier["contributions"]) <= EXPLAIN_TOP
    assert max(tier["contributions"].values()) > 0
    assert tier["contributions"].keys() == tier["features"].keys()
    assert tier["close_call"] is None  # close calls are off: no second prediction made


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
