"""State that several gateway instances share, behind one small interface.

``local`` (the default) shares nothing between instances: each routes on what it has seen
itself, as a single instance always did; the workers of one `serve --workers N` still share
with each other, over Unix sockets (worker_mesh.py). ``redis`` (GATEWAY_REDIS_URL, or the
policy's ``state:`` section: gateway/state_backend.py) shares, in background tasks only: the
prefix-index updates every dispatch makes (a Redis stream, in batches), each instance's
in-flight counts, arrivals and completions (a hash per instance with a heartbeat TTL). The
request path only appends to an in-memory outbox; it never waits for either.
"""

from __future__ import annotations

from gateway.shared_state.base import SharedState
from gateway.shared_state.local import LocalState
from gateway.shared_state.make import make_shared_state
from gateway.shared_state.outbox import Outbox

__all__ = ["LocalState", "Outbox", "SharedState", "make_shared_state"]
