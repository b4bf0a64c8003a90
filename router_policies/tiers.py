"""Which pool a tiered request goes to: the classifier's tier, then overflow under saturation.

Pure, like the replica decision: it sees each pool's load as plain numbers.
"""

from __future__ import annotations

from enum import StrEnum

from router_policies.tier_settings import TierSettings
from router_policies.value import value


class Tier(StrEnum):
    SMALL = "small"
    LARGE = "large"


@value
class PoolLoad:
    healthy: int
    queue_depth: float
    saturation_queue_per_replica: float

    @property
    def saturated(self) -> bool:
        return (
            self.healthy == 0
            or self.queue_depth >= self.saturation_queue_per_replica * self.healthy
        )


@value
class PoolChoice:
    pool: str
    overflow: bool
    close_call: bool = False
    """A close call, sent to the other tier's pool because it is predicted to answer first."""


def choose_pool(tier: Tier, settings: TierSettings, small: PoolLoad, large: PoolLoad) -> PoolChoice:
    """The tier's own pool, unless it is saturated and the policy lets the other one help.

    Easy work may always climb to the large pool (it answers easy questions too, at a higher
    cost); hard work goes down to the small pool only when the policy allows degrading.
    """
    overflow = settings.overflow
    if tier is Tier.SMALL:
        if overflow.enabled and small.saturated and not large.saturated:
            return PoolChoice(settings.large, overflow=True)
        return PoolChoice(settings.small, overflow=False)
    if overflow.enabled and overflow.allow_degrade and large.saturated and not small.saturated:
        return PoolChoice(settings.small, overflow=True)
    return PoolChoice(settings.large, overflow=False)


def tier_for(score: float, threshold: float) -> Tier:
    """Strictly above goes large: when many requests tie at the threshold (identical traffic),
    they stay small together instead of all climbing to the costly pool."""
    return Tier.LARGE if score > threshold else Tier.SMALL


def is_close_call(score: float, threshold: float, margin: float) -> bool:
    return margin > 0 and abs(score - threshold) <= margin


def close_call_choice(
    choice: PoolChoice,
    settings: TierSettings,
    own_s: float | None,
    other_s: float | None,
    other: PoolLoad,
) -> PoolChoice:
    """A close call's pool: the other tier's when it is predicted to answer first (TTFT
    ``other_s`` against ``own_s``) and not saturated; its own tier's on a tie or when a pool
    cannot predict (a policy without a cost model)."""
    if own_s is None or other_s is None or other.saturated or not other_s < own_s:
        return choice
    return PoolChoice(settings.other_pool(choice.pool), overflow=False, close_call=True)
