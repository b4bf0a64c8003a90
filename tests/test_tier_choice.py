"""Which pool a tiered request lands in, as a table of (tier, pool loads, policy) -> pool."""

from __future__ import annotations

import pytest

from router_policies.tier_settings import OverflowSettings, TierSettings
from router_policies.tiers import PoolLoad, Tier, choose_pool, tier_for

IDLE = PoolLoad(healthy=2, queue_depth=0, saturation_queue_per_replica=4)
BUSY = PoolLoad(healthy=2, queue_depth=8, saturation_queue_per_replica=4)
DOWN = PoolLoad(healthy=0, queue_depth=0, saturation_queue_per_replica=4)
DEFAULT = TierSettings(small="s", large="l")
DEGRADE = TierSettings(small="s", large="l", overflow=OverflowSettings(allow_degrade=True))
NO_OVERFLOW = TierSettings(small="s", large="l", overflow=OverflowSettings(enabled=False))

# fmt: off
CASES = [
    ("easy goes small", Tier.SMALL, DEFAULT, IDLE, IDLE, "s", False),
    ("hard goes large", Tier.LARGE, DEFAULT, IDLE, IDLE, "l", False),
    ("easy climbs when small is saturated", Tier.SMALL, DEFAULT, BUSY, IDLE, "l", True),
    ("easy climbs when small has no healthy replica", Tier.SMALL, DEFAULT, DOWN, IDLE, "l", True),
    ("easy stays when both are saturated", Tier.SMALL, DEFAULT, BUSY, BUSY, "s", False),
    ("hard does not degrade by default", Tier.LARGE, DEFAULT, IDLE, BUSY, "l", False),
    ("hard degrades when allowed", Tier.LARGE, DEGRADE, IDLE, BUSY, "s", True),
    ("hard stays when small is saturated too", Tier.LARGE, DEGRADE, BUSY, BUSY, "l", False),
    ("no overflow when it is off", Tier.SMALL, NO_OVERFLOW, BUSY, IDLE, "s", False),
    # A pool with no replica refuses at once; a busy one serves in turn.
    ("easy climbs to a busy large pool when small is down", Tier.SMALL, DEFAULT, DOWN, BUSY, "l", True),
    ("easy stays when both are down", Tier.SMALL, DEFAULT, DOWN, DOWN, "s", False),
    ("hard degrades to a busy small pool when large is down", Tier.LARGE, DEGRADE, BUSY, DOWN, "s", True),
    ("hard does not degrade to a down pool", Tier.LARGE, DEGRADE, DOWN, BUSY, "l", False),
]
# fmt: on


@pytest.mark.parametrize(("case", "tier", "settings", "small", "large", "pool", "overflow"), CASES)
def test_pool_choice(
    case: str,
    tier: Tier,
    settings: TierSettings,
    small: PoolLoad,
    large: PoolLoad,
    pool: str,
    overflow: bool,
) -> None:
    choice = choose_pool(tier, settings, small, large)
    assert (choice.pool, choice.overflow) == (pool, overflow), case


def test_saturation_is_queue_per_healthy_replica() -> None:
    assert not PoolLoad(2, 7.9, 4).saturated
    assert PoolLoad(2, 8, 4).saturated
    assert PoolLoad(0, 0, 4).saturated


def test_only_scores_above_the_threshold_go_large() -> None:
    assert tier_for(0.501, 0.5) is Tier.LARGE
    assert tier_for(0.5, 0.5) is Tier.SMALL
