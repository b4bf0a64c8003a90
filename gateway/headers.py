"""HTTP header names the gateway reads and writes: the one place they are spelled (CONTRACT)."""

from typing import Final

from replica.openai_api import REQUEST_ID

__all__ = [
    "POOL",
    "PRIORITY",
    "RATELIMIT_LIMIT_REQUESTS",
    "RATELIMIT_LIMIT_TOKENS",
    "RATELIMIT_REMAINING_REQUESTS",
    "RATELIMIT_REMAINING_TOKENS",
    "RATELIMIT_RESET_REQUESTS",
    "RATELIMIT_RESET_TOKENS",
    "REPLICA",
    "REQUEST_ID",
    "RETRY_AFTER",
    "RETRY_AFTER_MS",
    "ROUTE",
    "TIER",
    "TIER_SCORE",
    "TTFT_OBJECTIVE",
    "TTFT_OBJECTIVE_LLMD",
    "UNCOMPRESSED",
]
POOL: Final = "x-gateway-pool"
REPLICA: Final = "x-gateway-replica"
ROUTE: Final = "x-gateway-route"
TIER: Final = "x-gateway-tier"
"""The tier a classified request was given; as a request header, a tier to force (if allowed)."""
TIER_SCORE: Final = "x-gateway-tier-score"
TTFT_OBJECTIVE: Final = "x-gateway-ttft-objective-ms"
"""A request's own TTFT objective in milliseconds (the pool's cost.ttft_objective_s otherwise)."""
TTFT_OBJECTIVE_LLMD: Final = "x-llm-d-slo-ttft-ms"
"""llm-d's name for the same, read when the gateway's own is absent."""
PRIORITY: Final = "x-gateway-priority"
"""A request's priority class, an integer (0 when absent): higher leaves a saturated pool's
queue first; below 0 is sheddable (the Gateway API Inference Extension's convention)."""

# Per-tenant rate limits (gateway/rate_limit/), spelled as OpenAI sends them: on every answer
# to a tenant with limits, 429s included; reset is a duration ("1s", "6m0s", "20ms").
RATELIMIT_LIMIT_REQUESTS: Final = "x-ratelimit-limit-requests"
RATELIMIT_REMAINING_REQUESTS: Final = "x-ratelimit-remaining-requests"
RATELIMIT_RESET_REQUESTS: Final = "x-ratelimit-reset-requests"
RATELIMIT_LIMIT_TOKENS: Final = "x-ratelimit-limit-tokens"
RATELIMIT_REMAINING_TOKENS: Final = "x-ratelimit-remaining-tokens"
RATELIMIT_RESET_TOKENS: Final = "x-ratelimit-reset-tokens"
RETRY_AFTER: Final = "Retry-After"
"""Whole seconds until a limited request would be admitted (RFC 9110)."""
RETRY_AFTER_MS: Final = "retry-after-ms"
"""The same in milliseconds: the OpenAI SDKs read it before Retry-After."""
UNCOMPRESSED: Final = {"Accept-Encoding": "identity"}
"""Asked of every replica (its answers, stored responses, /metrics, model list): the gateway's
session does not decompress, it relays bytes as they come and reads its figures from them (and
prometheus_client's exporter gzips for aiohttp's default Accept-Encoding)."""
