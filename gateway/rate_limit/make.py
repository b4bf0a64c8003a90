"""Choosing the bucket store: Redis when GATEWAY_REDIS_URL is set (every instance shares the
buckets), else this process's memory (each instance enforces the limits on its own)."""

from __future__ import annotations

from gateway.metrics import GatewayMetrics
from gateway.rate_limit.limiter import RateLimiter
from gateway.rate_limit.store import BucketStore, LocalStore
from gateway.settings import Settings


def make_limiter(settings: Settings, metrics: GatewayMetrics) -> RateLimiter:
    store: BucketStore
    if settings.redis_url is None:
        store = LocalStore()
    else:
        # Imported here: a gateway without Redis configured never loads the client.
        from gateway.rate_limit.redis_store import RedisStore

        store = RedisStore(
            settings.redis_url.get_secret_value(),
            metrics.rate_limit_backend_errors,
            key_prefix=settings.state_key_prefix,
            timeout_s=settings.state_timeout_s,
        )
    return RateLimiter(
        store, metrics.tenant_requests, metrics.tenant_tokens, metrics.tenant_rate_limited
    )
