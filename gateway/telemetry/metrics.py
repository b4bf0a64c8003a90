"""The gateway's Prometheus metrics: every name in one place (CONTRACT), all prefixed gateway_.

Engine series are never re-exported under their vllm: names: Prometheus scrapes the engines
too, and a sum over both would count everything twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from gateway.fleet.pools import Fleet, PoolState, ReplicaState
from gateway.telemetry.retired_series import LabelledSeries, RetiredSeries

REQUESTS = "gateway_requests"  # exposed as gateway_requests_total
RETRIES = "gateway_retries"
TTFT = "gateway_ttft_seconds"
DURATION = "gateway_request_duration_seconds"
REPLICA_INFLIGHT = "gateway_replica_inflight"
REPLICA_REMOTE_INFLIGHT = "gateway_replica_remote_inflight"
REPLICA_HEALTHY = "gateway_replica_healthy"
REPLICA_EJECTED = "gateway_replica_ejected"
REPLICA_EJECTIONS = "gateway_replica_ejections"  # exposed as gateway_replica_ejections_total
REPLICA_ENGINE_WAITING = "gateway_replica_engine_waiting"
REPLICA_KV_USAGE = "gateway_replica_kv_usage"
REPLICA_INDEX_BLOCKS = "gateway_replica_prefix_index_blocks"
POOL_GATEWAY_WAITING = "gateway_pool_gateway_waiting"
POOL_QUEUE_DEPTH = "gateway_pool_queue_depth"
POOL_HEALTHY_REPLICAS = "gateway_pool_healthy_replicas"
POOL_DESIRED_REPLICAS = "gateway_pool_desired_replicas"
POOL_DESIRED_REPLICAS_RAW = "gateway_pool_desired_replicas_unstabilized"
POOL_KV_USAGE = "gateway_pool_kv_usage"
POOL_ARRIVALS = "gateway_pool_arrivals"  # exposed as gateway_pool_arrivals_total
POOL_ARRIVAL_RATE = "gateway_pool_arrival_rate"
POOL_REPLICA_CAPACITY = "gateway_pool_replica_capacity"
POLICY_RELOADS = "gateway_policy_reloads"
POLICY_LAST_RELOAD_OK = "gateway_policy_last_reload_successful"
TIER_THRESHOLD = "gateway_tier_threshold"
CLIENT_CONNECTIONS = "gateway_client_connections"
CONNECTIONS_REFUSED = "gateway_connections_refused"  # gateway_connections_refused_total
STATE_BACKEND_UP = "gateway_state_backend_up"
STATE_APPLY_LAG = "gateway_state_apply_lag_seconds"
TENANT_REQUESTS = "gateway_tenant_requests"  # exposed as gateway_tenant_requests_total
TENANT_TOKENS = "gateway_tenant_tokens"  # exposed as gateway_tenant_tokens_total
TENANT_RATE_LIMITED = "gateway_tenant_rate_limited"  # gateway_tenant_rate_limited_total
RATE_LIMIT_BACKEND_ERRORS = "gateway_rate_limit_backend_errors"  # ..._errors_total
WORKERS_REPLACED = "gateway_workers_replaced"  # exposed as gateway_workers_replaced_total
REPLICA_KV_EVENTS_EXACT = "gateway_replica_kv_events_exact"
REPLICA_KV_EVENT_GAPS = "gateway_replica_kv_event_gaps"  # exposed as ..._gaps_total
PREFIX_CACHED_TOKENS_ERROR = "gateway_prefix_cached_tokens_error"

_LAG_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 5.0)

NO_POOL = "none"
"""Pool and route label of requests rejected before a pool was chosen."""

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_DURATION_BUCKETS = (*_LATENCY_BUCKETS, 160.0, 320.0, 600.0, 1200.0, 1800.0)
"""A whole answer may take up to GATEWAY_ANSWER_TIMEOUT_S (1800 s): long generations' quantiles
are read off buckets that reach them, not from the last one below."""


ReplicaFigure = Callable[[PoolState, ReplicaState, float], float]
PoolFigure = Callable[[PoolState], float | None]

_REPLICA_GAUGES: tuple[tuple[str, str, ReplicaFigure], ...] = (
    (REPLICA_INFLIGHT, "Requests the gateway has in flight on the replica.",
     lambda pool, r, now: r.inflight),
    (REPLICA_REMOTE_INFLIGHT,
     "Requests the other gateway instances have in flight on the replica, as last read from "
     "the shared state (0 without one); routing counts both.",
     lambda pool, r, now: r.remote_inflight),
    (REPLICA_HEALTHY, "1 if the replica passes health checks, else 0.",
     lambda pool, r, now: 1.0 if r.healthy else 0.0),
    (REPLICA_EJECTED, "1 while the replica is ejected for failing requests, else 0.",
     lambda pool, r, now: 1.0 if r.outlier.ejected(now) else 0.0),
    (REPLICA_ENGINE_WAITING,
     "The replica's own waiting queue, as last scraped (vllm:num_requests_waiting).",
     lambda pool, r, now: r.engine.waiting),
    (REPLICA_KV_USAGE,
     "The replica's KV-cache usage 0-1, as last scraped (vllm:kv_cache_usage_perc).",
     lambda pool, r, now: r.engine.kv_usage),
    (REPLICA_INDEX_BLOCKS,
     "Capacity of the gateway's prefix index for the replica, in fingerprint blocks (sized "
     "from the replica's KV cache once scraped).",
     lambda pool, r, now: pool.router.index_blocks(r.name)),
)  # fmt: skip
"""Per replica: name, help, and how to read it from live state."""

_PoolFamily = type[GaugeMetricFamily | CounterMetricFamily]
_POOL_FAMILIES: tuple[tuple[str, str, _PoolFamily, PoolFigure], ...] = (
    (POOL_GATEWAY_WAITING,
     "Requests for the pool waiting inside this gateway instance for a replica.",
     GaugeMetricFamily, lambda pool: pool.gateway_waiting),
    (POOL_QUEUE_DEPTH,
     "Requests waiting in the gateway (every instance sharing state) plus the healthy "
     "replicas' waiting queues: the autoscaling signal's input.",
     GaugeMetricFamily, lambda pool: pool.queue_depth()),
    (POOL_HEALTHY_REPLICAS,
     "Replicas requests can go to: passing health checks and not ejected (as /ready counts).",
     GaugeMetricFamily, lambda pool: len(pool.routable())),
    (POOL_KV_USAGE, "Mean KV-cache usage 0-1 over the healthy replicas.",
     GaugeMetricFamily, lambda pool: pool.mean_kv_usage()),
    (POOL_ARRIVALS,
     "Requests routed to the pool, counted on arrival (demand, unlike the answered count of "
     "gateway_requests_total under overload).",
     CounterMetricFamily, lambda pool: pool.counts.arrivals),
    (POOL_ARRIVAL_RATE,
     "Arrivals per second over the pool's autoscale rate_window_s (the rate term's input).",
     GaugeMetricFamily, lambda pool: pool.autoscale.arrival_rate),
    (POOL_REPLICA_CAPACITY,
     "Requests/s one replica completes when saturated: measured at saturation, else "
     "estimated from its learned rates (absent until either exists).",
     GaugeMetricFamily, lambda pool: pool.autoscale.capacity_in_use),
    (POOL_DESIRED_REPLICAS,
     "Replicas the pool should have (the autoscaling signal, scale-down stabilised).",
     GaugeMetricFamily, lambda pool: pool.autoscale.desired),
    (POOL_DESIRED_REPLICAS_RAW, "The desired replica count before scale-down stabilisation.",
     GaugeMetricFamily, lambda pool: pool.autoscale.raw_desired),
)  # fmt: skip
"""Per pool: name, help, kind, and how to read it from live state (None: absent for now)."""


class FleetCollector(Collector):
    """Pool and replica gauges read from live state at scrape time, never updated per request."""

    def __init__(self, current: Callable[[], Fleet]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        fleet = self._current()
        now = time.monotonic()
        for name, documentation, replica_figure in _REPLICA_GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=["pool", "replica"])
            for pool in fleet.pools.values():
                for replica in pool.replicas.values():
                    value = replica_figure(pool, replica, now)
                    family.add_metric([pool.name, replica.name], value)
            yield family
        for name, documentation, kind, pool_figure in _POOL_FAMILIES:
            pools = kind(name, documentation, labels=["pool"])
            for pool in fleet.pools.values():
                figure = pool_figure(pool)
                if figure is not None:
                    pools.add_metric([pool.name], figure)
            yield pools
        threshold = GaugeMetricFamily(
            TIER_THRESHOLD,
            "Score from which a tiered request goes to the large pool (calibrated or fixed).",
            labels=["model"],
        )
        for model, tier in fleet.tiers.items():
            threshold.add_metric([model], tier.threshold)
        yield threshold
        yield from _kv_event_families(fleet, now)


def _kv_event_families(fleet: Fleet, now: float) -> Iterator[Metric]:
    exact = GaugeMetricFamily(
        REPLICA_KV_EVENTS_EXACT,
        "1 while routing reads the replica's KV-cache events, 0 while it falls back to the "
        "estimate (no event yet, a lost message, a stall); absent for replicas that publish none.",
        labels=["pool", "replica"],
    )
    gaps = CounterMetricFamily(
        REPLICA_KV_EVENT_GAPS,
        "KV-event messages from the replica lost beyond what its replay endpoint could fill, or "
        "that could not be read.",
        labels=["pool", "replica"],
    )
    error = SummaryMetricFamily(
        PREFIX_CACHED_TOKENS_ERROR,
        "|predicted - reported| cached prompt tokens of the replica a request went to, by the "
        "source of the prediction (events, estimate); sum/count is the mean absolute error.",
        labels=["pool", "source"],
    )
    for pool in fleet.pools.values():
        for replica in pool.replicas.values():
            if replica.kv_events is not None:
                labels = [pool.name, replica.name]
                exact.add_metric(labels, 1.0 if replica.kv_events.exact(now) else 0.0)
                gaps.add_metric(labels, replica.kv_events.gaps)
        errors = pool.learned.prediction_errors
        for source, count in errors.counts.items():
            if count:
                error.add_metric([pool.name, source], count, errors.sums[source])
    yield from (exact, gaps, error)


class GatewayMetrics:
    """Per-request instruments, in a registry of the gateway's own (one per app)."""

    def __init__(self, current: Callable[[], Fleet]) -> None:
        self.registry = CollectorRegistry()
        # Registered first: it drops the series of removed pools before the others are read.
        self.registry.register(
            RetiredSeries(current, self._by_fleet, self._forget_pool, unpooled=NO_POOL)
        )
        self.requests = Counter(
            REQUESTS, "Requests answered, by pool, route and HTTP status.",
            ["pool", "route", "code"], registry=self.registry,
        )  # fmt: skip
        self.retries = Counter(
            RETRIES, "Attempts moved to another replica after a failure before the first byte.",
            ["pool"], registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            TTFT, "Time from request arrival to the first streamed byte relayed to the client.",
            ["pool"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            DURATION, "Time from request arrival to the end of the response.",
            ["pool"], buckets=_DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.policy_reloads = Counter(
            POLICY_RELOADS, "Policy reloads by result (ok, error); an error keeps the old policy.",
            ["result"], registry=self.registry,
        )  # fmt: skip
        for result in ("ok", "error"):
            self.policy_reloads.labels(result)
        # The counter's error count stops rising while a bad file stays on disk, so an alert
        # on its increase clears; this stays 0 until a reload applies.
        self.policy_last_reload_ok = Gauge(
            POLICY_LAST_RELOAD_OK,
            "1 if the last policy reload applied (or none was tried yet), 0 if it failed and "
            "the policy in force is no longer the file on disk.",
            registry=self.registry,
        )
        self.policy_last_reload_ok.set(1)
        self.ejections = Counter(
            REPLICA_EJECTIONS, "Times the replica was ejected for consecutive failed requests.",
            ["pool", "replica"], registry=self.registry,
        )  # fmt: skip
        self.connections = Gauge(
            CLIENT_CONNECTIONS, "Open client connections.", registry=self.registry
        )
        self.connections_refused = Counter(
            CONNECTIONS_REFUSED,
            "Client connections refused at once because GATEWAY_MAX_CONNECTIONS were open.",
            registry=self.registry,
        )
        self.state_backend_up = Gauge(
            STATE_BACKEND_UP,
            "1 while the shared-state backend answers (always 1 for local), else 0: the "
            "instance then routes on its own observations only.",
            ["backend"], registry=self.registry,
        )  # fmt: skip
        self.state_apply_lag = Histogram(
            STATE_APPLY_LAG,
            "Time from a dispatch on another instance to its replay here (shared prefix index).",
            buckets=_LAG_BUCKETS, registry=self.registry,
        )  # fmt: skip
        # Per tenant: the label is the tenant's name from the policy, never its key.
        self.tenant_requests = Counter(
            TENANT_REQUESTS, "Requests admitted for the tenant (rate limits passed).",
            ["tenant"], registry=self.registry,
        )  # fmt: skip
        self.tenant_tokens = Counter(
            TENANT_TOKENS,
            "Tokens the tenant used: the usage replicas reported, else the gateway's estimate.",
            ["tenant"], registry=self.registry,
        )  # fmt: skip
        self.tenant_rate_limited = Counter(
            TENANT_RATE_LIMITED, "Requests answered 429, by tenant and the limit hit.",
            ["tenant", "limit"], registry=self.registry,
        )  # fmt: skip
        self.rate_limit_backend_errors = Counter(
            RATE_LIMIT_BACKEND_ERRORS,
            "Rate-limit checks Redis did not answer: those requests were served unlimited.",
            registry=self.registry,
        )
        self.registry.register(FleetCollector(current))
        self._answered: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._ttft: dict[str, Histogram] = {}

    def _by_fleet(self) -> list[LabelledSeries]:
        """The labelled metrics whose series name a pool (and replica) of the policy."""
        by_pool = ("pool",)
        return [
            (self.requests, ("pool", "route", "code")), (self.retries, by_pool),
            (self.ttft, by_pool), (self.duration, by_pool), (self.ejections, ("pool", "replica")),
        ]  # fmt: skip

    def _forget_pool(self, pool: str) -> None:
        self._answered = {key: kids for key, kids in self._answered.items() if key[0] != pool}
        self._ttft.pop(pool, None)

    def policy_reloaded(self, ok: bool) -> None:
        self.policy_reloads.labels("ok" if ok else "error").inc()
        self.policy_last_reload_ok.set(1 if ok else 0)

    def answered(self, pool: str, route: str, status: int, started: float) -> None:
        """A request ended: counted, and its duration observed."""
        # Labelled children are looked up once per label set: .labels() costs microseconds.
        key = (pool, route, status)
        children = self._answered.get(key)
        if children is None:
            children = self._answered[key] = (
                self.requests.labels(pool, route, str(status)),
                self.duration.labels(pool),
            )
        requests, duration = children
        requests.inc()
        duration.observe(time.perf_counter() - started)

    def ttft_of(self, pool: str) -> Histogram:
        histogram = self._ttft.get(pool)
        if histogram is None:
            histogram = self._ttft[pool] = self.ttft.labels(pool)
        return histogram
