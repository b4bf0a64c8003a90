"""Specification of the shipped learned tier model as a whole
(router_policies/tier_classifier_learned.py): it scores obvious maths and code above obvious
chit-chat, always strictly between 0 and 1 and even for a request with no messages; it explains a
score by the few features that pushed it most, which add up with the bias to the logit; and its
model file round-trips, is saved deterministically, is rejected with the reason when it is bad,
and ships small."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import orjson
import pytest

from router_policies.tier_classifier_learned import EXPLAIN_TOP, LearnedTierModel, features
from tests.tier_learning import OBVIOUSLY_EASY, OBVIOUSLY_HARD, SHIPPED
from tests.tiers import chat

# --- the shipped model ranks obvious cases -------------------------------------------------------


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


def corrupted(data: bytes) -> bytes:
    """``data`` with bytes inside its deflate stream flipped (a disk or a copy gone wrong)."""
    return data[:100] + bytes(b ^ 0xFF for b in data[100:140]) + data[140:]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not json", "not a tier model file"),
        (corrupted(SHIPPED.to_bytes()), "not a tier model file"),
        (gzip.compress(b'{"format": "other"}', mtime=0), "format"),
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
