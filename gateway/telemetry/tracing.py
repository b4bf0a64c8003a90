"""OpenTelemetry traces, off by default (`GATEWAY_OTEL=true`).

Each proxied request is a span (`llm-gateway request`: pool, route, status), with a child for
the routing decision (`route`: replica, route, predicted TTFT) and one per attempt at a replica
(`upstream`), whose W3C trace context goes to the replica in `traceparent` (vLLM continues the
trace when it traces). A client's own `traceparent` is the request span's parent. Spans go out
over OTLP/HTTP in JSON (every OTLP receiver accepts it), configured by the standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, ...). Off, this module is not imported and
the proxy checks one attribute per request.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from gateway.fleet.pools import PoolState
from gateway.fleet.replicas import Dispatch
from gateway.http.exchange import Exchange
from gateway.relay.proxy import Forwarder
from gateway.routing.routed import Failure, Forwarding, Routed
from router_policies.decision import Decision

REQUEST_SPAN = "llm-gateway request"
ROUTE_SPAN = "route"
UPSTREAM_SPAN = "upstream"
_FLUSH_S = 1.0
"""How long the exit waits for the last spans to go out: within the 3 s the process gives its
clean-up (gateway/server.py), the rest of which runs before."""


def otlp_provider() -> TracerProvider:
    """Spans batched to the OTLP/HTTP JSON exporter; the resource and the exporter read the
    OTEL_* environment (service name default: llm-gateway)."""
    from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, where set
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "llm-gateway"}))
    # Not at exit: the exporter retries an unreachable collector for seconds (close()).
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("llm-gateway")

    async def close(self, within_s: float = _FLUSH_S) -> None:
        """Sends the spans still batched, waiting for that ``within_s`` at most: a collector
        that is down or hangs must not hold up the gateway's exit (its exporter retries for
        seconds, in a thread that exits with the process)."""
        loop = asyncio.get_running_loop()
        sent = loop.create_future()

        def done() -> None:
            if not sent.done():
                sent.set_result(None)

        def flush() -> None:
            self.provider.shutdown()  # flushes (its own timeout is the exporter's, not ours)
            with suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(done)

        threading.Thread(target=flush, name="span flush", daemon=True).start()
        with suppress(TimeoutError):
            await asyncio.wait_for(sent, within_s)

    @contextmanager
    def request(self, sent: Mapping[str, str], pool: str, request_id: str) -> Iterator[Any]:
        """The request's span, a child of the client's trace context if it sent one."""
        parent = propagate.extract({k.lower(): v for k, v in sent.items()})
        with self._tracer.start_as_current_span(
            REQUEST_SPAN,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"llm_gateway.pool": pool, "llm_gateway.request_id": request_id},
        ) as span:
            yield span

    @contextmanager
    def route(self) -> Iterator[Any]:
        with self._tracer.start_as_current_span(ROUTE_SPAN) as span:
            yield span

    @staticmethod
    def decided(span: Any, decision: Decision) -> None:
        span.set_attribute("llm_gateway.replica", decision.replica)
        span.set_attribute("llm_gateway.route", decision.route.value)
        if decision.estimate is not None:
            span.set_attribute("llm_gateway.predicted_ttft_s", decision.estimate.total_s)

    @contextmanager
    def upstream(self, replica: str) -> Iterator[tuple[Any, dict[str, str]]]:
        """An attempt's span, and the headers that carry its context to the replica."""
        with self._tracer.start_as_current_span(
            UPSTREAM_SPAN, kind=trace.SpanKind.CLIENT, attributes={"llm_gateway.replica": replica}
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=trace.set_span_in_context(span, Context()))
            yield span, carrier


class TracedForwarder(Forwarder):
    """The proxy with spans: the request's, the routing decision's, and each attempt's, whose
    context the replica gets instead of the client's. The plain Forwarder has none of this."""

    def __init__(self, *args: Any, tracing: Tracing) -> None:
        super().__init__(*args)
        self.tracing = tracing

    async def forward(self, exchange: Exchange, routed: Routed) -> int:
        with self.tracing.request(exchange.headers, routed.pool.name, routed.request_id) as span:
            status = await super().forward(exchange, routed)
            span.set_attribute("http.response.status_code", status)
            return status

    async def _acquire(
        self, pool: PoolState, routed: Routed, skip: list[str], attempt: int
    ) -> Dispatch | None:
        with self.tracing.route() as span:
            dispatch = await super()._acquire(pool, routed, skip, attempt)
            if dispatch is not None:
                self.tracing.decided(span, dispatch.decision)
            return dispatch

    async def _attempt(
        self, req: Forwarding, dispatch: Dispatch, out: list[tuple[str, str]], last: bool
    ) -> int | Failure:
        with self.tracing.upstream(dispatch.replica.name) as (span, context):
            own = [(name, value) for name, value in out if name.lower() not in context]
            sent = own + list(context.items())
            result = await super()._attempt(req, dispatch, sent, last)
            status = result.status if isinstance(result, Failure) else result
            span.set_attribute("http.response.status_code", status)
            return result
