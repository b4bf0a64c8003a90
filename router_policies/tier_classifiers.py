"""The tier classifier interface and the policy's choice between its implementations.

- ``cue``: the hand-weighted cue model (router_policies/tier_classifier.py), weights in the
  policy file; every feature a person can read and tune.
- ``learned``: a linear model over word features trained on labelled prompts
  (router_policies/tier_classifier_learned.py); the shipped default model, or the file at
  ``tiers.<name>.model``.

Both return a ``TierScore``: a score in (0, 1), and the features and contributions that the
dry run (/admin/route) shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from router_policies.tier_classifier import TierScore, score
from router_policies.tier_classifier_learned import LearnedTierModel
from router_policies.tier_settings import TierSettings, TierWeights


class TierClassifier(Protocol):
    name: str

    def score(self, body: Mapping[str, Any]) -> TierScore: ...


class CueClassifier:
    name = "cue"

    def __init__(self, weights: TierWeights) -> None:
        self.weights = weights

    def score(self, body: Mapping[str, Any]) -> TierScore:
        return score(body, self.weights)


_loaded: dict[tuple[str | None, int], LearnedTierModel] = {}
"""Models by (path, mtime): a policy reload that keeps the same file does not read it again."""


def load_learned(path: str | None) -> LearnedTierModel:
    """The model at ``path`` (None: the shipped default); raises OSError, ValueError."""
    mtime = Path(path).stat().st_mtime_ns if path is not None else 0
    key = (path, mtime)
    model = _loaded.get(key)
    if model is None:
        model = LearnedTierModel.load(path)
        _loaded.clear()  # one model in memory per process is the common case; never a leak
        _loaded[key] = model
    return model


def build_classifier(settings: TierSettings) -> TierClassifier:
    if settings.classifier == "learned":
        return load_learned(settings.model)
    return CueClassifier(settings.weights)
