"""Choosing the bucket store: Redis with the Redis state backend (every instance shares the
buckets; gateway/state_backend.py), else this process's memory (each instance enforces the
limits on its own)."""

from __future__ import annotations

from gateway.rate_limit.limiter import RateLimiter
from gateway.rate_limit.store import BucketStore, LocalStore
from gateway.settings import Settings
from gateway.state_backend import BackendChoice
from gateway.telemetry.metrics import GatewayMetrics


def make_limiter(settings: Settings, choice: BackendChoice, metrics: GatewayMetrics) -> RateLimiter:
    store: BucketStore
    if choice.redis_url is None:
        store = LocalStore()
    else:
        # Imported here: a gateway without Redis configured never loads the client.
        from gateway.rate_limit.leases import LeasedStore
        from gateway.rate_limit.redis_store import RedisStore

        shared = RedisStore(
            choice.redis_url.get_secret_value(),
            metrics.rate_limit_backend_errors,
            key_prefix=choice.key_prefix,
            timeout_s=settings.state_timeout_s,
        )
        lease_s = settings.rate_limit_lease_s
        store = LeasedStore(shared, lease_s) if lease_s > 0 else shared
    return RateLimiter(
        store, metrics.tenant_requests, metrics.tenant_tokens, metrics.tenant_rate_limited
    )
