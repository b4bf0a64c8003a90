"""A request on its way to a replica, and what the Forwarder records of how it ended."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway import headers
from gateway.fleet.pools import PoolState
from gateway.fleet.replicas import Dispatch
from gateway.http.exchange import Exchange
from gateway.http.request_body import Endpoint, ParsedRequest
from gateway.relay.usage import final_usage_part, prompt_usage, usage_object
from gateway.routing.affinity import RouteHooks
from gateway.routing.resolve import Resolution
from gateway.telemetry.metrics import NO_POOL
from router_policies.decision import Route
from router_policies.fingerprint import RequestFeatures
from router_policies.value import value

_CHOICES_STREAMED = frozenset((Endpoint.CHAT, Endpoint.COMPLETIONS))
"""Streams of chunks with choices, whose usage comes in a final event without any."""
CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away first (nginx's convention)."""
STREAM_FAILED = 502
"""Status recorded for a stream whose replica failed it after its first byte (its wire status
is 200): broken, cut short before its end, or carrying vLLM's error event."""


@value
class Routed:
    """A request with its pool and final features, ready to forward: the one record the proxy
    (or the picker) reads from resolution to the answer."""

    resolution: Resolution
    """Its pool, tier verdict and placement (gateway/routing/resolve.py)."""
    features: RequestFeatures
    """The resolution's, with the client's hints and, where events are read, token keys."""
    request_id: str
    started: float
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    """Headers the response carries besides the routing ones (e.g. the tier)."""
    on_usage: Callable[[bytes], None] | None = None
    """Sees relayed bytes that carry `usage` (a tenant's token charge is corrected by it)."""
    on_dispatch: Callable[[], None] | None = None
    """Told when the request goes to a replica: from then on its tokens may be generated, so a
    tenant's charge stands if the client leaves."""

    def dispatched(self) -> None:
        """The request goes to a replica (``on_dispatch``)."""
        if self.on_dispatch is not None:
            self.on_dispatch()

    @property
    def parsed(self) -> ParsedRequest:
        return self.resolution.parsed

    @property
    def pool(self) -> PoolState:
        return self.resolution.pool

    @property
    def hooks(self) -> RouteHooks | None:
        """Replicas to keep to (a stored response, an adapter's) and what to learn from the
        answer."""
        return self.resolution.hooks

    def learn_usage(self, dispatch: Dispatch, data: bytes) -> bool:
        """What the replica's `usage`, where ``data`` carries one, teaches the pool and the
        tenant's token charge; whether it carried one."""
        if self.parsed.stream and self.parsed.endpoint in _CHOICES_STREAMED:
            final = final_usage_part(data)
            if final is None:
                return False
            data = final
        found = usage_object(data)
        if found is None or (usage := prompt_usage(found)) is None:
            return False
        if self.parsed.previous_response_id is None:
            # A follow-up's prompt holds the stored conversation too, which the gateway never
            # saw: its size would teach a wrong characters-per-token and index belief.
            self.pool.learned.observe(dispatch, usage)
        if self.on_usage is not None:
            self.on_usage(found)
        return True

    def refusal_headers(self) -> dict[str, str]:
        """What an answer the gateway gives itself once the pool is chosen carries (no
        replica answered): the request's id, its pool, and the tier and rate limits as a
        replica's answer would."""
        return {
            **self.extra_headers,
            headers.REQUEST_ID: self.request_id,
            headers.POOL: self.pool.name,
        }

    def answer_headers(self, replica: str, decided: Route) -> dict[str, str]:
        """What every answer carries besides the replica's own: the request's id, where it
        went and why (a follow-up pinned to its stored response's replica, else the
        resolution's route, e.g. overflow, over the replica decision's)."""
        route = self.resolution.answer_route(decided)
        return {
            **self.extra_headers,
            headers.REQUEST_ID: self.request_id,
            headers.POOL: self.pool.name,
            headers.REPLICA: replica,
            headers.ROUTE: route.value,
        }


@dataclass(slots=True)
class Failure:
    status: int
    body: bytes
    content_type: str
    final: bool = False
    """The request's own fault (vLLM refused it in its stream): answered, not retried."""


@dataclass(slots=True)
class Outcome:
    """What gateway_requests_total records for the request, whatever way it ends."""

    route: str = NO_POOL
    status: int = CLIENT_CLOSED
    wire: int = CLIENT_CLOSED
    """The status the answer went out with (a stream that failed midway: its 200)."""


@dataclass(slots=True)
class Forwarding:
    """One request through the Forwarder: every attempt reads where to answer and what was
    routed, and writes how it ended."""

    exchange: Exchange
    routed: Routed
    body: bytes
    """What the replicas are sent: the client's body, or it asking for a stream's usage."""
    asked_usage: bool = False
    """The gateway asked for the stream's usage: the client does not get that event."""
    outcome: Outcome = field(default_factory=Outcome)
