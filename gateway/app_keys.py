"""What the gateway process keeps on its aiohttp application, by typed key: read by the
handlers aiohttp serves and by the front's (gateway/http/front.py) alike."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.fleet.outlier import OutlierDetector
from gateway.policy.reload import PolicyHolder
from gateway.rate_limit import RateLimiter
from gateway.relay.proxy import Forwarder
from gateway.routing.affinity import RoutingMemory
from gateway.routing.tokenize import TokenKeys
from gateway.settings import Settings
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.pod_metrics import PodMetrics


class Lifecycle:
    """What shutdown needs to know: whether it has begun, and which requests are in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.inflight: set[asyncio.Task[object]] = set()


POLICY = web.AppKey("policy", PolicyHolder)
SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", GatewayMetrics)
POD_METRICS = web.AppKey("pod_metrics", PodMetrics)
FORWARDER = web.AppKey("forwarder", Forwarder)
OUTLIERS = web.AppKey("outliers", OutlierDetector)
LIMITER = web.AppKey("limiter", RateLimiter)
MEMORY = web.AppKey("routing_memory", RoutingMemory)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
TOKEN_KEYS = web.AppKey("token_keys", TokenKeys)
