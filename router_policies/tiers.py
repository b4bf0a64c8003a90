"""Which pool a tiered request goes to: the classifier's tier, then overflow (at saturation,
or for an easy request the large pool is predicted to answer sooner) and close calls.

Pure, like the replica decision: it sees each pool's load as plain numbers.
"""

from __future__ import annotations

import math
from enum import StrEnum

from router_policies.tier_settings import TierSettings
from router_policies.value import value


class Tier(StrEnum):
    SMALL = "small"
    LARGE = "large"


@value
class PoolLoad:
    healthy: int
    """Replicas a request can go to: passing health checks and not ejected."""
    queue_depth: float
    saturation_queue_per_replica: float
    backlogged: bool = False
    """Every healthy replica has a request waiting for its first token (the gateway's own
    count, immediate, unlike the engines' scraped queues): none can start another at once."""

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
    """A close call, sent to the other tier's pool because it would wait less there for that
    pool's speed (``close_call_choice``)."""
    stored: bool = False
    """The response a /v1/responses follow-up continues (``previous_response_id``) is stored
    in this pool: only the replica that holds it can continue, whatever the follow-up scores."""


def choose_pool(tier: Tier, settings: TierSettings, small: PoolLoad, large: PoolLoad) -> PoolChoice:
    """The tier's own pool, unless it is saturated and the policy lets the other one help.

    Easy work may always climb to the large pool (it answers easy questions too, at a higher
    cost); hard work goes down to the small pool only when the policy allows degrading.
    """
    overflow = settings.overflow
    if tier is Tier.SMALL:
        if overflow.enabled and small.saturated and _helps(small, large):
            return PoolChoice(settings.large, overflow=True)
        return PoolChoice(settings.small, overflow=False)
    if overflow.enabled and overflow.allow_degrade and large.saturated and _helps(large, small):
        return PoolChoice(settings.small, overflow=True)
    return PoolChoice(settings.large, overflow=False)


def _helps(own: PoolLoad, other: PoolLoad) -> bool:
    """Whether the other pool takes a saturated pool's request: where it is not saturated
    itself, or, busy, where the own pool has no replica to route to (there the request would
    be refused at once, and in the other it waits its turn, up to the queue timeout)."""
    return other.healthy > 0 and (not other.saturated or own.healthy == 0)


def tier_for(score: float, threshold: float) -> Tier:
    """Strictly above goes large: when many requests tie at the threshold (identical traffic),
    they stay small together instead of all climbing to the costly pool."""
    return Tier.LARGE if score > threshold else Tier.SMALL


def is_close_call(score: float, threshold: float, margin: float) -> bool:
    return margin > 0 and abs(score - threshold) <= margin


@value
class PoolPrediction:
    """A pool's predicted TTFT for a request, as its policy would route it now, beside the
    same replica's prediction for it idle and holding none of it: the scale that TTFT is read
    against, since a large model is slower at everything."""

    ttft_s: float
    idle_cold_s: float

    @property
    def stretch(self) -> float:
        """Above 1: a queue ahead of the request; below 1: history it need not prefill."""
        return self.ttft_s / self.idle_cold_s if self.idle_cold_s > 0 else math.inf


def close_call_choice(
    choice: PoolChoice,
    settings: TierSettings,
    own: PoolPrediction | None,
    other: PoolPrediction | None,
    other_load: PoolLoad,
    near_ratio: float,
) -> PoolChoice:
    """A close call's pool: the other tier's when the request would wait there less, relative
    to what it costs there idle and cold, beyond ``near_ratio`` (the cost model's band of
    equally good predictions), would answer there no later, and it is not saturated; its own
    tier's otherwise, or when a pool cannot predict (a policy without a cost model).

    Comparing absolute TTFTs alone would send every close call to the faster (small) model
    whenever it is not swamped: a lower share sent large, which a higher threshold gives as
    well. Read against each pool's own idle, cold cost, a close call leaves the tier the
    classifier leaned to only for a pool that is backed up or for one that holds the
    conversation's history; and never for a slower answer, as a queue on the fast model
    would otherwise send it cold to the slow one."""
    if own is None or other is None or other_load.saturated:
        return choice
    if not (other.stretch * (1 + near_ratio) < own.stretch and other.ttft_s <= own.ttft_s):
        return choice
    return PoolChoice(settings.other_pool(choice.pool), overflow=False, close_call=True)


def may_climb(tier: Tier, settings: TierSettings, small: PoolLoad) -> bool:
    """Whether an easy request's pools are worth predicting for a climb to the large pool: only
    while the small pool has a queue, in the gateway or ahead of every replica's next prefill
    (otherwise the small model answers sooner anyway)."""
    overflow = settings.overflow
    queued = small.backlogged or small.queue_depth > 0
    return tier is Tier.SMALL and overflow.enabled and overflow.predicted and queued


def climb_choice(
    choice: PoolChoice,
    settings: TierSettings,
    own: PoolPrediction | None,
    other: PoolPrediction | None,
    other_load: PoolLoad,
    near_ratio: float,
) -> PoolChoice:
    """An easy request's pool while the small one has a queue: the large pool, as overflow,
    when it is predicted to answer sooner beyond ``near_ratio`` and is not saturated; the
    small one otherwise, or when a pool cannot predict. The same signature as
    ``close_call_choice``: both read the two pools' predictions."""
    if own is None or other is None or other_load.saturated:
        return choice
    if not other.ttft_s * (1 + near_ratio) < own.ttft_s:
        return choice
    return PoolChoice(settings.large, overflow=True)
