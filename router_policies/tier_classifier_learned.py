"""A learned easy/hard score: a linear model over named word and word-pair features.

score = sigmoid(bias + sum(w[f] for f in text features) / sqrt(#text features)
                + sum(w[m] for m in request features))

- Text features are the distinct lower-cased words (digits written as ``0``) of the task's
  user messages, the first and the latest (a conversation's task is set in its first turn:
  "Can you make it shorter?" alone says nothing), and each maths or code punctuation mark present
  (``_MARKS``; a binary bag of words, L2-normalised): ``$``, ``^``, ``\\``, ``(`` and ``=``
  carry much of the signal in maths and code. Pairs of neighbouring words were tried: no
  better on held-out sources, and 2.5x the decision time.
- Request features (``#len:k``, ``#turns:k``, ``#tools``, ...) are coarse buckets of what the
  body says besides its text; they are named strings too, so one weight table holds everything.
- Only the head and the tail of a long message are read (``SCAN_HEAD`` + ``SCAN_TAIL``
  characters of each of the two): the question sits at one end of a pasted document, and the
  cost stays flat.

Features are looked up by name in a dict (no hashing), so an explanation names the words that
pushed a score. Inference is pure Python over C-level builtins (``re``, ``set``, ``map``): no
numpy, no GPU, no network. Training lives in the tooling (``llm-gateway tiers train``).

The model file is gzip-compressed JSON (``MODEL_FORMAT``): the bias and a weight per feature
name.
"""

from __future__ import annotations

import gzip
import heapq
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson

from router_policies.conversation import answer_budget, asks_structured_output
from router_policies.tier_classifier import TierScore, _sigmoid, task_texts

MODEL_FORMAT = "llm-gateway/tier-linear"
MODEL_VERSION = 1
DEFAULT_MODEL = "tier_default.json.gz"
"""The shipped model, in router_policies/models/ (built by ``llm-gateway tiers train``)."""

SCAN_HEAD = 3072
SCAN_TAIL = 1024
"""Characters read at the start and at the end of a long last user message."""
EXPLAIN_TOP = 8
"""How many of the strongest contributions an explanation lists."""

_PUNCT = b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
"""ASCII punctuation: split off words (``_MARKS``, below, are features of their own too)."""
_PROSE = b"!\"',.:;?"
"""Sentence punctuation: split off words like the rest, but no feature of its own. Whether a
prompt ends in a full stop or asks with a question mark is the style of the set it came from
(CLINC's and NQ's queries have none, maths problems do), and a model that learned "." as a sign
of difficulty scored "Hi there." as hard."""
_MARKS = bytes(c for c in _PUNCT if c not in _PROSE)
"""Punctuation that is a feature: ``$``, ``^``, ``\\``, ``(``, ``=`` and the like, which
maths and code are written in."""
_TABLE = bytes(32 if c in _PUNCT else 48 if 48 <= c <= 57 else c for c in range(256))
"""Lower-cased UTF-8 bytes -> words: punctuation becomes a space, every digit ``0`` (so 48 and
17 are the same word, 2026 another)."""
_SENTENCE_TABLE = bytes(46 if c in b".?!" else 32 if c in b" \t\r\n" else 120 for c in range(256))
"""UTF-8 bytes -> where sentences end: a full stop, question or exclamation mark becomes ``.``,
white space a space, anything else ``x``; a sentence ends at each ``. `` (not at a decimal
point, nor at a text's last mark). One translate and one count: a regular expression or a
count per mark costs 2-3x as much."""

Feature = bytes | int | str
"""A word (its UTF-8 bytes), a punctuation mark (its byte), a request feature (``#...``)."""


def _bucket(value: int) -> int:
    """log2 bucket: 0 for 0, then 1, 2-3, 4-7, ..."""
    return value.bit_length()


def scan_window(text: str) -> str:
    if len(text) <= SCAN_HEAD + SCAN_TAIL:
        return text
    return text[:SCAN_HEAD] + "\n" + text[-SCAN_TAIL:]


def _window(text: str) -> bytes:
    """The scanned window, lower-cased, as UTF-8: what the text features are read from."""
    return scan_window(text).lower().encode("utf-8", "replace")


def text_features(raw: bytes) -> set[Feature]:
    """Distinct words and punctuation marks of a window (``_window``).

    Works on bytes: ``bytes.translate`` and ``bytes.split`` are the fastest tokenizer CPython
    has (a regex costs several times more on a 2 KB prompt)."""
    words = raw.translate(_TABLE).split()
    out: set[Feature] = set(words)
    out.update([c for c in _MARKS if c in raw])
    return out


def _length(text: str) -> int:
    return min(_bucket(len(text)) // 2, 8)


def _sentences(raw: bytes) -> int:
    """log2 bucket of the sentence ends in a window, up to 7 (64 or more)."""
    # Stripped: a text that ends in white space says no more than one that does not.
    return min(_bucket(raw.translate(_SENTENCE_TABLE).rstrip().count(b". ")), 7)


def request_features(
    body: Mapping[str, Any], texts: Sequence[str], turns: int, sentences: int
) -> list[str]:
    """The non-text features, as names: every request has exactly one length, sentences and
    turns bucket.

    The length is the task's, its first user message's: a follow-up's ("Why?") says nothing
    of how big the task is, and read as the length it made every conversation look like a
    short question. The latest message's length, in a conversation, is a feature of its own.
    So is the number of sentences the task is told in: a chained problem (deduction, planning,
    a word problem) states its facts one by one before it asks, where a query, however long,
    is one sentence; a bag of words cannot see that (docs/tier-eval.md has what it changed).
    ``sentences`` is the task's bucket (``_sentences``)."""
    out = [f"#len:{_length(texts[0])}", f"#sentences:{sentences}", f"#turns:{min(turns, 4)}"]
    if len(texts) > 1:
        out.append(f"#latest_len:{_length(texts[-1])}")
    if body.get("tools"):
        out.append("#tools")
    if asks_structured_output(body):
        out.append("#structured_output")
    max_tokens = answer_budget(body)
    if max_tokens is not None:
        out.append(f"#max_tokens:{min(_bucket(max_tokens) // 2, 7)}")
    return out


def features(body: Mapping[str, Any]) -> tuple[set[Feature], list[str]]:
    """(text features, request features) of a request body; training uses this same function."""
    texts, turns = task_texts(body)
    task = _window(texts[0])
    words = text_features(task)
    for text in texts[1:]:
        words |= text_features(_window(text))
    return words, request_features(body, texts, turns, _sentences(task))


def feature_name(feature: Feature) -> str:
    """How a feature is written in the model file and in explanations."""
    if isinstance(feature, str):
        return feature
    if isinstance(feature, int):
        return chr(feature)
    return feature.decode("utf-8", "replace")


def parse_feature(name: str) -> Feature:
    """The inverse of ``feature_name``: one mark is punctuation, ``#...`` a request feature."""
    if len(name) == 1 and ord(name) < 128 and ord(name) in _MARKS:
        return ord(name)
    if name.startswith("#"):
        return name
    return name.encode()


class _Contributions(Mapping[str, float]):
    """The strongest contributions of one score, computed only when read (dry runs, logs):
    the request path never pays for sorting them."""

    def __init__(
        self, weights: Mapping[Feature, float], text: set[Feature], meta: list[str], norm: float
    ) -> None:
        self._args = (weights, text, meta, norm)
        self._top: dict[str, float] | None = None

    def _computed(self) -> dict[str, float]:
        if self._top is None:
            weights, text, meta, norm = self._args
            parts = [(feature_name(f), weights[f] * norm) for f in text if f in weights]
            parts += [(m, weights[m]) for m in meta if m in weights]
            top = heapq.nlargest(EXPLAIN_TOP, parts, key=lambda p: abs(p[1]))
            self._top = {name: round(value, 4) for name, value in top}
        return self._top

    def __getitem__(self, key: str) -> float:
        return self._computed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())


class LearnedTierModel:
    """A loaded linear model; ``score`` is pure and thread-safe (the tables are read-only)."""

    name = "learned"

    def __init__(
        self, bias: float, weights: Mapping[str, float], meta: Mapping[str, Any] | None = None
    ) -> None:
        self.bias = float(bias)
        self.weights: dict[Feature, float] = {
            parse_feature(k): float(v) for k, v in weights.items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        self._get = self.weights.get

    def logit(self, text_features: set[Feature], meta: Iterable[str]) -> float:
        get = self._get
        norm = 1.0 / math.sqrt(len(text_features)) if text_features else 0.0
        total = sum(map(get, text_features, repeat(0.0)))
        return self.bias + total * norm + sum(map(get, meta, repeat(0.0)))

    def score(self, body: Mapping[str, Any]) -> TierScore:
        text, meta = features(body)
        norm = 1.0 / math.sqrt(len(text)) if text else 0.0
        result = _sigmoid(self.logit(text, meta))
        contributions = _Contributions(self.weights, text, meta, norm)
        # `features` shows the same names with their feature values (1/sqrt(n) for text).
        shown = _FeatureValues(contributions, norm)
        return TierScore(result, shown, contributions, self.name)

    # --- the file ---------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        doc = {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "scan": {"head": SCAN_HEAD, "tail": SCAN_TAIL},
            "meta": self.meta,
            "bias": self.bias,
            "weights": {feature_name(f): round(w, 5) for f, w in self.weights.items()},
        }
        return gzip.compress(orjson.dumps(doc), compresslevel=9, mtime=0)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> LearnedTierModel:
        try:
            doc = orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        except (OSError, EOFError, zlib.error, orjson.JSONDecodeError) as exc:
            # zlib.error: a corrupt deflate stream, which gzip does not wrap in its own errors.
            raise ValueError(f"{source}: not a tier model file ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            raise ValueError(f"{source}: not a tier model file (format is not {MODEL_FORMAT!r})")
        if doc.get("version") != MODEL_VERSION:
            raise ValueError(f"{source}: tier model version {doc.get('version')} is not supported")
        weights = doc.get("weights")
        if not isinstance(weights, dict) or not isinstance(doc.get("bias"), int | float):
            raise ValueError(f"{source}: tier model lacks 'bias' or 'weights'")
        try:
            return cls(doc["bias"], weights, doc.get("meta"))
        except (TypeError, ValueError) as exc:
            # As ValueError, like every other fault of the file: the policy's loader names it.
            raise ValueError(f"{source}: not a tier model file ({exc})") from None

    @classmethod
    def load(cls, path: str | Path | None = None) -> LearnedTierModel:
        """The model at ``path``, or the shipped default; raises OSError, ValueError."""
        if path is None:
            data = resources.files("router_policies.models").joinpath(DEFAULT_MODEL).read_bytes()
            return cls.from_bytes(data, DEFAULT_MODEL)
        return cls.from_bytes(Path(path).read_bytes(), str(path))


class _FeatureValues(Mapping[str, float]):
    """Each explained feature's value: 1/sqrt(n) for a text feature, 1 for a request one."""

    def __init__(self, contributions: _Contributions, norm: float) -> None:
        self._contributions = contributions
        self._norm = round(norm, 4)

    def __getitem__(self, key: str) -> float:
        self._contributions[key]  # KeyError for a feature that is not explained
        return 1.0 if key.startswith("#") else self._norm

    def __iter__(self) -> Iterator[str]:
        return iter(self._contributions)

    def __len__(self) -> int:
        return len(self._contributions)
