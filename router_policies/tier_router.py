"""A virtual model's tiering state: the classifier settings and the calibrated threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router_policies.calibration import QuantileThreshold
from router_policies.schema import InvalidPolicy
from router_policies.tier_classifier import TierScore
from router_policies.tier_classifiers import CueClassifier, TierClassifier, build_classifier
from router_policies.tier_memory import ConversationTiers, conversation_keys
from router_policies.tier_settings import TierSettings
from router_policies.tiers import Tier, tier_for
from router_policies.value import value


@value
class TierVerdict:
    tier: Tier
    score: TierScore
    threshold: float
    forced: bool
    conversation: int | None = None
    """The key its conversation is remembered under if it goes large
    (router_policies/tier_memory.py): the one it is remembered under already (so that
    remembering it again refreshes it, here and in the shared state), else the whole
    request's; None where it has none."""
    kept: bool = False
    """Large because its conversation went large before, though its own score is below."""
    remembered: bool = False
    """Its conversation went large before: large, whatever its own score."""


class TierRouter:
    def __init__(
        self, model: str, settings: TierSettings, previous: TierRouter | None = None
    ) -> None:
        self.model = model
        self.settings = settings
        self.conversations: ConversationTiers = (
            previous.conversations if previous is not None else ConversationTiers()
        )
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
        if keep and previous is not None and previous._calibrator is not None:
            # Same scores, same target: the window of recent traffic is still valid. The fixed
            # threshold, which applies until min_samples, is the new policy's.
            self._calibrator = previous._calibrator.with_initial(settings.threshold)
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

    def classify(self, body: Mapping[str, Any], forced: Tier | None = None) -> TierVerdict:
        """Pure with respect to calibration: `observe` records real traffic separately, so a
        dry run leaves the threshold where it was. ``forced``: the tier a client forces, where
        the policy lets it (gateway/routing/client_hints.py reads the header)."""
        result = self.classifier.score(body)
        threshold = self.threshold
        if forced is not None:
            return TierVerdict(forced, result, threshold, forced=True)
        tier = tier_for(result.score, threshold)
        keys = conversation_keys(body) if self.settings.conversation_memory else None
        if keys is None:
            return TierVerdict(tier, result, threshold, False)
        # Looked up whatever the score: a conversation remembered already is remembered again
        # under the same key, not under each of its later turns, which would crowd others out.
        remembered = self.conversations.remembered_key(keys)
        kept = remembered is not None and tier is Tier.SMALL
        if kept:
            tier = Tier.LARGE
        key = keys[-1] if remembered is None else remembered
        return TierVerdict(tier, result, threshold, False, key, kept, remembered is not None)

    def observe(self, verdict: TierVerdict, *, sent_large: bool) -> int | None:
        """Real traffic (never a dry run): the calibration's window, and the conversations
        that went large; the request's conversation when it was remembered as large. A large
        verdict a close call sent to the small pool is not remembered: the conversation's
        history is cached there, and its next turn is judged afresh rather than sent cold to
        the large pool."""
        if self._calibrator is not None:
            self._calibrator.observe(verdict.score.score)
        if verdict.tier is Tier.LARGE and sent_large and verdict.conversation is not None:
            self.remember(verdict.conversation)
            return verdict.conversation
        return None

    def remember(self, conversation: int) -> None:
        """``conversation`` went large (here, or in another instance that shares it)."""
        if self.settings.conversation_memory:
            self.conversations.remember(conversation, self.settings.conversation_memory)


def _same_scores(old: TierRouter, new: TierRouter) -> bool:
    """Whether both score every request alike: the same cue weights, or the same loaded model
    (router_policies/tier_classifiers.py keeps each file's model while the file is unchanged)."""
    if isinstance(new.classifier, CueClassifier) and isinstance(old.classifier, CueClassifier):
        return old.settings.weights == new.settings.weights
    return old.classifier is new.classifier
