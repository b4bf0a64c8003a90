"""The interface of a shared-state backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.fleet.pools import Fleet
    from gateway.routing.affinity import RoutingMemory


class SharedState:
    """A backend: started with the live fleet (re-read each round, so reloads are followed)."""

    backend: str = "local"

    def share_memory(self, memory: RoutingMemory) -> None:
        """Tell the other processes where this one's stored responses are, and ask them for
        the ones it does not know (vLLM keeps a stored response on the one replica that made
        it, and a client's next call may reach any process); learn from their dispatches
        which replicas served which LoRA adapter."""

    async def start(self, fleet: Callable[[], Fleet]) -> None:
        """Begin sharing; never raises for an unreachable backend (the gateway serves anyway)."""

    async def stop(self) -> None:
        """Stop the background tasks and withdraw this instance's figures."""

    @property
    def up(self) -> bool:
        return True
