"""Policy-file section ``prefix.events``: where each replica publishes its KV-cache events, and
how far to trust the stream (defaults with their reasons; schema.py holds the rest)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator

from router_policies.strict_model import StrictModel


class PrefixSource(StrEnum):
    """What the router believes a replica holds."""

    EVENTS = "events"
    """Exactly what its engine says it stores and evicts (every replica must publish)."""
    ESTIMATE = "estimate"
    """What the gateway sent there, bounded like the engine's cache (no events read)."""
    AUTO = "auto"
    """Events where a replica publishes them (an endpoint is configured), else the estimate."""


def _connectable(address: str) -> str:
    # ZeroMQ refuses these only when the gateway connects, after a reload has taken them.
    scheme, sep, rest = address.partition("://")
    if scheme == "ipc" and sep and rest:
        return address
    host, colon, port = rest.rpartition(":")
    if scheme == "tcp" and sep and colon and host not in ("", "*") and "@" not in host:
        if port.isascii() and port.isdigit() and 1 <= int(port) <= 65535:
            return address
    raise ValueError(
        f"{address!r} is not an address to subscribe at: tcp://host:port (the replica's host, "
        "where vLLM's own config has *) or ipc://path"
    )


ZmqAddress = Annotated[str, AfterValidator(_connectable)]


class EventEndpoint(StrictModel):
    endpoint: ZmqAddress
    """The replica's PUB socket: vLLM's KVEventsConfig.endpoint as seen from the gateway."""
    replay: ZmqAddress | None = None
    """Its replay (ROUTER) socket, where it has one (KVEventsConfig.replay_endpoint)."""


class KvEventsSettings(StrictModel):
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Every replica publishes at tcp://<its host>:<port> (a pod per replica; vLLM's default
    endpoint is tcp://*:5557). None: only the replicas in ``endpoints`` publish."""
    replay_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Their replay endpoint's port, where vLLM runs with a replay_endpoint."""
    topic: str = ""
    """KVEventsConfig.topic (vLLM's default: none)."""
    endpoints: dict[str, EventEndpoint] = Field(default_factory=dict)
    """Replica base URL -> its endpoints, for replicas that share a host (a loopback fleet)."""
    stall_s: Annotated[float, Field(gt=0)] = 5.0
    """A replica that computed new blocks and reported none for this long is routed to on the
    estimate until its next event: an engine reports a step's blocks within milliseconds."""
    resync_s: Annotated[float, Field(ge=0)] = 30.0
    """After a lost message, the estimate for this long: what the index believed held is dropped
    (an eviction may have gone missing) and it starts again from what is stored afterwards,
    with the blocks that is stored on."""
    tokenize_timeout_s: Annotated[float, Field(gt=0)] = 1.0
    """Longest wait for a replica's /tokenize (a request's token blocks); past it, the request
    is routed on the estimate."""

    @field_validator("endpoints")
    @classmethod
    def _as_replicas_are_written(
        cls, endpoints: dict[str, EventEndpoint]
    ) -> dict[str, EventEndpoint]:
        # The pool's replica URLs lose a trailing slash: a key copied from them must match.
        return {url.strip().rstrip("/"): endpoint for url, endpoint in endpoints.items()}

    def endpoint_for(self, url: str) -> EventEndpoint | None:
        own = self.endpoints.get(url)
        if own is not None or self.port is None:
            return own
        host = urlsplit(url).hostname or ""
        host = f"[{host}]" if ":" in host else host
        replay = f"tcp://{host}:{self.replay_port}" if self.replay_port else None
        return EventEndpoint(endpoint=f"tcp://{host}:{self.port}", replay=replay)
