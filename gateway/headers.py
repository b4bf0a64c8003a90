"""HTTP header names the gateway reads and writes: the one place they are spelled (CONTRACT)."""

from typing import Final

REQUEST_ID: Final = "x-request-id"
POOL: Final = "x-gateway-pool"
REPLICA: Final = "x-gateway-replica"
ROUTE: Final = "x-gateway-route"
