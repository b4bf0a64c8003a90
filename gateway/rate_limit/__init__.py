"""Per-API-key (tenant) rate limits: who the key belongs to, token buckets, 429s.

The arithmetic lives in router_policies/rate_limit.py (pure); here are the stores (in-process,
or Redis shared by every instance, taken in leases by a busy tenant), authentication by key
hash, and the limiter the request handler calls.
"""

from gateway.rate_limit.keys import hash_key
from gateway.rate_limit.limiter import Admission, RateLimiter
from gateway.rate_limit.store import BucketStore, LocalStore

__all__ = ["Admission", "BucketStore", "LocalStore", "RateLimiter", "hash_key"]
