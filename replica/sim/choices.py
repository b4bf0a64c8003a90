"""The choices of one HTTP request (n > 1), each a request of the engine, read as one stream."""

import asyncio
from collections.abc import AsyncIterator

from replica.sim.engine import SimRequest


async def merged(requests: list[SimRequest]) -> AsyncIterator[tuple[int, int, str | None]]:
    """(index in ``requests``, token, finish reason) of several requests (the choices of one
    HTTP request), in the order the engine produces them."""
    if len(requests) == 1:
        async for token, reason in requests[0].stream():
            yield 0, token, reason
        return
    queue: asyncio.Queue[tuple[int, int, str | None] | Exception | None] = asyncio.Queue()

    async def pump(index: int, request: SimRequest) -> None:
        try:
            async for token, reason in request.stream():
                queue.put_nowait((index, token, reason))
        except Exception as exc:  # EngineFailed: re-raised to the reader below
            queue.put_nowait(exc)
        queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
