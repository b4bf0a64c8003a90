"""A virtual model's tiering state: the classifier settings and the calibrated threshold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router_policies.calibration import QuantileThreshold
from router_policies.schema import InvalidPolicy
from router_policies.tier_classifier import TierScore
from router_policies.tier_classifiers import CueClassifier, TierClassifier, build_classifier
from router_policies.tier_settings import TierSettings
from router_policies.tiers import Tier, tier_for

_TIER_NAMES = frozenset(t.value for t in Tier)


@dataclass(frozen=True, slots=True)
class TierVerdict:
    tier: Tier
    score: TierScore
    threshold: float
    forced: bool


class TierRouter:
    def __init__(
        self, model: str, settings: TierSettings, previous: TierRouter | None = None
    ) -> None:
        self.model = model
        self.settings = settings
        try:
            self.classifier: TierClassifier = build_classifier(settings)
        except (OSError, ValueError) as exc:
            raise InvalidPolicy(
                [f"tiers.{model}.model: cannot load the tier model: {exc}"]
            ) from exc
        calibration = settings.calibration
        self._calibrator: QuantileThreshold | None
        keep = (
            previous is not None
            and previous.settings.calibration == calibration
            and _same_scores(previous, self)
        )
        if keep and previous is not None:
            # Same scores, same target: the window of recent traffic is still valid.
            self._calibrator = previous._calibrator
        elif calibration is not None:
            self._calibrator = QuantileThreshold(
                calibration.target_large_share,
                calibration.window,
                calibration.min_samples,
                initial=settings.threshold,
            )
        else:
            self._calibrator = None

    @property
    def threshold(self) -> float:
        return self._calibrator.threshold if self._calibrator else self.settings.threshold

    def classify(self, body: Mapping[str, Any], forced: str | None = None) -> TierVerdict:
        """Pure with respect to calibration: `observe` records real traffic separately, so a
        dry run leaves the threshold where it was."""
        result = self.classifier.score(body)
        threshold = self.threshold
        if forced in _TIER_NAMES and self.settings.allow_header_override:
            return TierVerdict(Tier(str(forced)), result, threshold, forced=True)
        return TierVerdict(tier_for(result.score, threshold), result, threshold, forced=False)

    def observe(self, verdict: TierVerdict) -> None:
        if self._calibrator is not None:
            self._calibrator.observe(verdict.score.score)


def _same_scores(old: TierRouter, new: TierRouter) -> bool:
    """Whether both score every request alike: the same cue weights, or the same loaded model
    (models are cached by path and modification time, so an unchanged file is the same one)."""
    if isinstance(new.classifier, CueClassifier) and isinstance(old.classifier, CueClassifier):
        return old.settings.weights == new.settings.weights
    return old.classifier is new.classifier
