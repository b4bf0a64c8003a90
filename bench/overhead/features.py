"""The gateway with its features on, a target of ``bench overhead`` beside the bare one: what
prefix-aware routing, model tiers (the learned classifier), a per-key rate limit and shared
state through Redis add per request, on the same zero-delay replica."""

from __future__ import annotations

import hashlib
from typing import Any

from bench.launcher import start_gateway
from bench.overhead.config import MODEL, ZERO_DELAY, Target
from replica.processes import ManagedProcess, start_sim_replicas

FEATURES = "gateway, features on"
TIER_MODEL = "auto"
"""The virtual model the features target's requests name: the tier classifier picks a pool."""
LARGE_MODEL = "sim-large"
API_KEY = "bench-overhead-key"
"""The one tenant's key: a loopback benchmark's, never a secret."""
UNLIMITED = 10**9
"""Limits that are checked on every request but never reached."""


async def start_features(small_url: str, redis_url: str, processes: list[ManagedProcess]) -> Target:
    """The features target: a replica of the large model beside ``small_url`` (zero-delay
    too), and a gateway with the features policy sharing its state through ``redis_url``.
    Every process started joins ``processes``."""
    [large] = await start_sim_replicas(1, model=LARGE_MODEL, **ZERO_DELAY)
    processes.append(large)
    # Its own key prefix: the other targets on this Redis share nothing with it.
    env = {"GATEWAY_REDIS_URL": redis_url, "GATEWAY_STATE_KEY_PREFIX": "features"}
    gateway = await start_gateway(features_policy(small_url, large.url), env=env)
    processes.append(gateway)
    return Target(FEATURES, gateway.url, gateway.pid, model=TIER_MODEL, api_key=API_KEY)


def features_policy(small_url: str, large_url: str) -> dict[str, Any]:
    """Two prefix-aware pools behind the tier model, and one tenant with request and token
    limits."""
    return {
        "pools": {
            "small": {"model": MODEL, "replicas": [small_url]},
            "large": {"model": LARGE_MODEL, "replicas": [large_url]},
        },
        "tiers": {TIER_MODEL: {"small": "small", "large": "large", "classifier": "learned"}},
        "limits": {
            "tenants": {
                "bench": {
                    "api_key_sha256": [hashlib.sha256(API_KEY.encode()).hexdigest()],
                    "requests_per_minute": UNLIMITED,
                    "tokens_per_minute": UNLIMITED,
                }
            }
        },
    }
