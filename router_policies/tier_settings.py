"""Policy-file section ``tiers``: a virtual model whose requests a classifier sends to a
small or a large pool (router_policies/tiers.py); defaults with their reasons."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from router_policies.strict_model import StrictModel
from router_policies.yaml_locations import error_at

POLICY_FOLDER = "policy_folder"
"""Key of the validation context naming the policy file's folder (None: text read from no
file), which relative paths in it are read from."""


class TierClassifierName(StrEnum):
    CUE = "cue"
    LEARNED = "learned"


class TierWeights(StrictModel):
    """Classifier weights (router_policies/tier_classifier.py); every feature is in [0, 1]."""

    bias: float = -3.0
    length: float = 2.0
    code: float = 2.0
    math: float = 2.5
    reasoning: float = 2.5
    turns: float = 1.0
    max_tokens: float = 1.0
    tools: float = 1.0
    structured_output: float = 0.5


class Calibration(StrictModel):
    target_large_share: Annotated[float, Field(ge=0.0, le=1.0)]
    """Share of recent tiered traffic to send to the large pool."""
    window: Annotated[int, Field(ge=10, le=1_000_000)] = 1000
    """Recent scores the quantile is taken over. At most a million: each request's score is
    inserted into the sorted window, ~0.14 ms a request at that size (a far larger window
    cannot even be allocated)."""
    min_samples: Annotated[int, Field(ge=1)] = 100
    """Below this many scores the fixed threshold applies."""

    @model_validator(mode="after")
    def _window_reaches_min_samples(self) -> Calibration:
        if self.min_samples > self.window:
            # The window never holds more than `window` scores: the fixed threshold would
            # apply forever, with nothing to say so.
            raise error_at(
                ("min_samples",),
                f"min_samples ({self.min_samples}) is above window ({self.window}): "
                "calibration would never start; lower min_samples or raise window",
                self.min_samples,
            )
        return self


class OverflowSettings(StrictModel):
    enabled: bool = True
    """Easy requests may use the large pool when the small one is saturated."""
    allow_degrade: bool = False
    """Hard requests may use the small pool when the large one is saturated."""
    predicted: bool = False
    """Off by default: on two simulated pools it showed no consistent gain, and the hard
    requests paid for the climbs in two of three report seeds (each climb a cold prefill on the
    large model ahead of the hard requests queued there; docs/tier-overflow.md). On: easy
    requests also climb to the large pool, before the small one saturates, while the
    small pool has a queue and the large one is predicted to answer them sooner, beyond the
    cost model's near band (each pool's prediction as its policy would route the request now,
    what each holds of the conversation counted). Checked only while the small pool has a
    queue (in the gateway, in its engines, or a request waiting for its first token on every
    replica), so a pool that can start a request at once pays nothing; a pool without a cost
    model climbs at saturation only. Hard requests go down at saturation only
    (`allow_degrade`): the small model nearly always answers sooner, which is no reason to give
    up the large one."""


class TierSettings(StrictModel):
    small: str
    """Pool for easy requests."""
    large: str
    """Pool for hard requests."""
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """Scores above go large (the starting point when calibration is on)."""
    calibration: Calibration | None = None
    classifier: TierClassifierName = TierClassifierName.LEARNED
    """`learned` (default): a word-feature model trained on public labelled prompts
    (router_policies/tier_classifier_learned.py, docs/tier-eval.md); `cue`: the hand-weighted
    cue model (`weights`)."""
    model: str | None = None
    """Model file of the `learned` classifier (`llm-gateway tiers train`); unset: the shipped
    default. Read when the policy is loaded; a relative path from the policy file's folder
    (where a Kubernetes ConfigMap mounts both), not the gateway's working directory."""
    _folder: Path | None = PrivateAttr(default=None)
    weights: TierWeights = TierWeights()
    """Weights of the `cue` classifier."""
    allow_header_override: bool = False
    """Lets clients force a tier with the x-gateway-tier request header."""
    conversation_memory: Annotated[int, Field(ge=0)] = 100_000
    """Conversations remembered as having gone large, whose later turns then stay large
    (router_policies/tier_memory.py; about 100 bytes each); 0: every turn scored alone."""
    overflow: OverflowSettings = OverflowSettings()
    close_call_margin: Annotated[float, Field(ge=0.0, le=0.5)] = 0.0
    """A request scored within this of the threshold is a close call: the classifier cannot
    tell which pool it needs, so it goes to the pool where it would wait least for that pool's
    speed (each pool's cost model, what each holds of the conversation counted;
    docs/routing.md). 0: off (no close call costs a second routing decision). A conversation
    kept large, a forced tier and overflow are never close calls."""

    def other_pool(self, pool: str) -> str:
        """The pool of the other tier."""
        return self.large if pool == self.small else self.small

    @model_serializer(mode="wrap")
    def _weights_of_the_cue_only(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The effective policy reads back as the same policy: no weights the learned refuses.
        data: dict[str, Any] = dump(self)
        if self.classifier is not TierClassifierName.CUE:
            data.pop("weights", None)
        return data

    @model_validator(mode="after")
    def _two_pools(self) -> TierSettings:
        if self.small == self.large:
            raise error_at(
                ("large",),
                f"small and large are both pool {self.small!r}: a tier needs two pools (a "
                "client that wants one pool names its model)",
                self.large,
            )
        return self

    @property
    def model_file(self) -> str | None:
        """Where ``model`` is: a relative path from the policy file's folder."""
        if self.model is None or self._folder is None:
            return self.model
        return str(self._folder / self.model)  # an absolute `model` stays as it is

    @model_validator(mode="after")
    def _model_needs_learned(self, info: ValidationInfo) -> TierSettings:
        # Kept as written (the effective policy reads back as the same wherever it is moved);
        # the folder beside it, to find the file.
        folder = (info.context or {}).get(POLICY_FOLDER)
        self._folder = Path(folder) if folder is not None else None
        if self.model is not None and self.classifier is not TierClassifierName.LEARNED:
            why = "`model` is the learned classifier's file: set `classifier: learned`"
            raise error_at(("model",), why, self.model)
        if self.model_file is not None and not Path(self.model_file).is_file():
            # Caught here so that check-policy names it; its content is checked at load.
            raise error_at(("model",), f"no file {self.model!r}", self.model)
        return self
