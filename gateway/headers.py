"""HTTP header names the gateway reads and writes: the one place they are spelled (CONTRACT)."""

from typing import Final

REQUEST_ID: Final = "x-request-id"
POOL: Final = "x-gateway-pool"
REPLICA: Final = "x-gateway-replica"
ROUTE: Final = "x-gateway-route"
TIER: Final = "x-gateway-tier"
"""The tier a classified request was given; as a request header, a tier to force (if allowed)."""
TIER_SCORE: Final = "x-gateway-tier-score"
