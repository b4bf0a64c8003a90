"""The default backend: nothing shared, each instance routes on its own observations."""

from __future__ import annotations

from gateway.shared_state.base import SharedState


class LocalState(SharedState):
    backend = "local"
