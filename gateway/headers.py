"""HTTP header names the gateway reads and writes: the one place they are spelled (CONTRACT)."""

from typing import Final

from replica.openai_api import REQUEST_ID

__all__ = ["POOL", "REPLICA", "REQUEST_ID", "ROUTE", "TIER", "TIER_SCORE"]
POOL: Final = "x-gateway-pool"
REPLICA: Final = "x-gateway-replica"
ROUTE: Final = "x-gateway-route"
TIER: Final = "x-gateway-tier"
"""The tier a classified request was given; as a request header, a tier to force (if allowed)."""
TIER_SCORE: Final = "x-gateway-tier-score"
