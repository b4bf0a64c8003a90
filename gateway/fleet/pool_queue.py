"""Requests waiting in the gateway for a replica slot of a saturated pool."""

from __future__ import annotations

import asyncio
import bisect
import itertools


class PoolSaturated(Exception):
    """No replica slot freed up within the pool's queue timeout, or (``shed``) none was free
    for a sheddable request, which never waits, or (``removed``: the pool's model) a policy
    reload removed the pool while the request waited for a slot."""

    def __init__(self, pool: str, *, shed: bool = False, removed: str | None = None) -> None:
        super().__init__(pool)
        self.pool = pool
        self.shed = shed
        self.removed = removed


class Ticket:
    """A request's place in line, held for its whole wait: its rechecks never send it to the
    back."""

    __slots__ = ("key", "offered", "waiter")

    def __init__(self, priority: int, order: int) -> None:
        self.key = (-priority, order)
        self.waiter: asyncio.Future[None] | None = None
        """Set while it waits; done once a freed slot is offered to it."""
        self.offered = False
        """Its last wait ended with a slot offered to it."""


def _key(ticket: Ticket) -> tuple[int, int]:
    return ticket.key


class PoolQueue:
    """Requests waiting in the gateway for a replica slot: the highest priority first, first
    come first served within one. A request keeps its ticket until it is dispatched or gives
    up, so one offered a slot is still in line (newcomers queue behind it) until it takes it."""

    def __init__(self) -> None:
        self._tickets: list[Ticket] = []
        """In line order."""
        self._order = itertools.count()
        self.closed = False
        """A reload removed the pool: no replica will take those in line (close())."""

    def __len__(self) -> int:
        return len(self._tickets)

    def ahead_of(self, priority: int) -> bool:
        """Whether a request of ``priority`` would queue behind one already waiting."""
        return any(-ticket.key[0] >= priority for ticket in self._tickets)

    def join(self, priority: int) -> Ticket:
        ticket = Ticket(priority, next(self._order))
        bisect.insort(self._tickets, ticket, key=_key)
        return ticket

    def leave(self, ticket: Ticket, *, pass_on: bool) -> None:
        """``ticket`` is out of line. ``pass_on``: it was offered a slot or took one, so the
        next in line looks for another (several may have freed up at once, as when replicas
        are added) or takes the one it left."""
        self._tickets.remove(ticket)
        if pass_on:
            self.wake_one()

    async def wait(self, ticket: Ticket, timeout_s: float) -> bool:
        """Until a slot is offered to ``ticket`` (True) or ``timeout_s`` passes (False)."""
        waiter = ticket.waiter = asyncio.get_running_loop().create_future()
        ticket.offered = False
        try:
            # Not wait_for: on 3.11 it returns, not raises, when its task is cancelled after
            # the offer, and a request whose client left would go on to a replica.
            async with asyncio.timeout(timeout_s):
                await waiter
        except TimeoutError:
            pass
        finally:
            # Also when its request is cancelled after the offer: leave() passes it on.
            ticket.offered = waiter.done() and not waiter.cancelled()
            ticket.waiter = None
        return ticket.offered

    def first(self, ticket: Ticket) -> bool:
        """Whether no ticket ahead of ``ticket`` waits, or was offered a slot it has yet to
        look at (one whose wait timed out is checking for itself, as ``ticket`` is)."""
        for other in self._tickets:
            if other is ticket:
                return True
            if other.waiter is not None and not other.waiter.cancelled():
                return False
        return True

    def close(self) -> None:
        """Wake every ticket in line, for good: each looks again, sees ``closed`` and leaves."""
        self.closed = True
        for ticket in self._tickets:
            if ticket.waiter is not None and not ticket.waiter.done():
                ticket.waiter.set_result(None)

    def wake_one(self, after: Ticket | None = None) -> None:
        """Offer a freed slot to the first ticket in line still waiting (behind ``after``: one
        that could not use it, a retry kept off that replica, say, passes it on)."""
        tickets = self._tickets
        start = 0 if after is None else tickets.index(after) + 1
        for ticket in tickets[start:]:
            waiter = ticket.waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
                return
