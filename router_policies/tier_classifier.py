"""An explainable easy/hard score for a request, from features a person can read.

score = sigmoid(bias + sum(weight_i * feature_i)), every feature in [0, 1]. The weights live in
the policy file; the dry-run endpoint shows each feature's contribution, so an operator can
see why a request went where it went and tune one number at a time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from router_policies.conversation import answer_budget, asks_structured_output, chat_messages
from router_policies.tier_settings import TierWeights
from router_policies.value import value

_SCAN_CHARS = 4000
"""Cues are searched in the head and tail of the task's user messages, the first and the
latest: long pastes add cost, not signal."""

# Each pattern errs towards missing a cue rather than inventing one: a date, a price or a line
# of prose ending in ";" is not evidence of a hard request.
# Blanks within a line are [^\S\n]* (a CRLF's \r among them), never \s*: under MULTILINE a \s*
# would run from every line start through a whole run of blank lines, quadratic in it (8,000
# newlines: 1.3 s on the event loop).
_CODE = re.compile(
    r"```|^[^\S\n]*(def|class|import|from \S+ import|#include|public|private|fn|func|const|let"
    r"|var)\s|^[^\S\n]*(SELECT|CREATE TABLE|INSERT INTO)\b|=>"
    r"|\b\w+\([^()\n]{0,80}\)[^\S\n]*[{:][^\S\n]*$|^[^\S\n]*[{}][^\S\n]*$",
    re.MULTILINE,
)
_MATH = re.compile(
    r"\$[^$\d\s][^$]*\$|\\(frac|int|sum|sqrt|lim|prod|binom)\b|[∫∑∏√∞≤≥≠≈∂∇ℝℕℤℚ²³⁴⁵ⁿ]"
    r"|\b\w\s*\^\s*[\w({]|\b(integral|derivative|theorem|lemma|prove|proof|show that|"
    r"equation|matrix|eigen\w*|probability|expected (value|number)|polynomial|modulo|divisible|"
    r"how many)\b",
    re.IGNORECASE,
)
_REASONING = re.compile(
    r"\b(step[- ]by[- ]step|explain why|why does|trade-?offs?|compare|contrast|analy[sz]e|"
    r"design|architect\w*|evaluate|justify|derive|optimi[sz]e|debug|refactor|"
    r"pros and cons|in depth|detailed)\b",
    re.IGNORECASE,
)
_LENGTH_SATURATION = 8000
"""Characters of the task's first user message at which the length feature reaches 1 (log
scale)."""
_TURNS_SATURATION = 6
_MAX_TOKENS_SATURATION = 4096


@value
class TierScore:
    score: float
    features: Mapping[str, float]
    contributions: Mapping[str, float]
    """Each feature's push on the logit (for the learned model: the strongest few)."""
    classifier: str = "cue"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def task_texts(body: Mapping[str, Any]) -> tuple[tuple[str, ...], int]:
    """(the first and the latest user message, or the one there is, or with none the system
    and developer messages; the number of user turns), of a chat or a /v1/responses
    conversation alike. A completion's prompt is one message."""
    messages = chat_messages(body)
    if messages:
        user_turns = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        if not user_turns:
            # The task is in the instructions alone (an agent's system prompt, a /v1/responses
            # request with `instructions` and no input text): they are what is asked.
            lead = (
                _text(m.get("content"))
                for m in messages
                if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
            )
            return ("\n".join(lead),), 0
        latest = _text(user_turns[-1].get("content"))
        if len(user_turns) == 1:
            return (latest,), 1
        return (_text(user_turns[0].get("content")), latest), len(user_turns)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):  # a batch, or what the replica will refuse
        prompt = " ".join(map(str, prompt)) if isinstance(prompt, list) else ""
    return (prompt,), 1


def _scan_window(text: str) -> str:
    if len(text) <= _SCAN_CHARS:
        return text
    half = _SCAN_CHARS // 2
    return text[:half] + "\n" + text[-half:]


def _saturating(value: float, saturation: float) -> float:
    return min(1.0, math.log1p(max(value, 0.0)) / math.log1p(saturation))


def _cue_density(pattern: re.Pattern[str], text: str) -> float:
    # Two or three cues say as much as twenty: saturate quickly.
    hits = sum(1 for _ in zip(range(3), pattern.finditer(text), strict=False))
    return hits / 3


def extract_features(body: Mapping[str, Any]) -> dict[str, float]:
    texts, turns = task_texts(body)
    # The task is set in the first user message; a follow-up ("Now do it in Rust") may add to
    # it. Both are read, and the length is the task's: a bare follow-up says nothing of its size.
    window = "\n".join(_scan_window(text) for text in texts)
    max_tokens = answer_budget(body) or 0
    structured = asks_structured_output(body)
    return {
        "length": _saturating(len(texts[0]), _LENGTH_SATURATION),
        "code": _cue_density(_CODE, window),
        "math": _cue_density(_MATH, window),
        "reasoning": _cue_density(_REASONING, window),
        "turns": min(1.0, (turns - 1) / (_TURNS_SATURATION - 1)) if turns > 1 else 0.0,
        "max_tokens": _saturating(
            max_tokens if isinstance(max_tokens, int) else 0, _MAX_TOKENS_SATURATION
        ),
        "tools": 1.0 if body.get("tools") else 0.0,
        "structured_output": 1.0 if structured else 0.0,
    }


def score(body: Mapping[str, Any], weights: TierWeights) -> TierScore:
    features = extract_features(body)
    contributions = {name: getattr(weights, name) * value for name, value in features.items()}
    logit = weights.bias + sum(contributions.values())
    return TierScore(_sigmoid(logit), features, contributions)


def _sigmoid(x: float) -> float:
    # Written so that exp never overflows, whatever weights an operator sets.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
