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

from collections import OrderedDict
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


CACHED_MODELS = 8
"""Model files kept loaded. Every file the policy names must still be here at the next reload:
a tier whose model is read again gets a new scorer, and its calibration window restarts
(router_policies/tier_router.py). A policy names one or a few; at the shipped model's size
(11,000 features, about 1.5 MB in memory) eight cost some 12 MB. A policy naming more still
works; only its tiers' windows restart at each reload."""

_FileKey = tuple[str | None, int, int, int, int]
_loaded: OrderedDict[_FileKey, LearnedTierModel] = OrderedDict()
"""Models by path and the file's identity, modification time and size, least recently used
first: a reload that keeps a file does not read it again and gets the same model."""


def load_learned(path: str | None) -> LearnedTierModel:
    """The model at ``path`` (None: the shipped default); raises OSError, ValueError."""
    key: _FileKey = (None, 0, 0, 0, 0)
    if path is not None:
        # The inode too: a file replaced by a rename (a ConfigMap update) may keep its size
        # and, on a coarse clock, its modification time.
        st = Path(path).stat()
        key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    model = _loaded.get(key)
    if model is not None:
        _loaded.move_to_end(key)
        return model
    model = LearnedTierModel.load(path)
    for stale in [k for k in _loaded if k[0] == path]:
        # The file has changed: its old version is never asked for again.
        del _loaded[stale]
    _loaded[key] = model
    while len(_loaded) > CACHED_MODELS:
        _loaded.popitem(last=False)
    return model


def build_classifier(settings: TierSettings) -> TierClassifier:
    if settings.classifier == "learned":
        return load_learned(settings.model_file)
    return CueClassifier(settings.weights)
