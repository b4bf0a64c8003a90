"""Stopping background tasks in a bounded time, even one that missed its cancellation.

A cancellation can be lost. On Python 3.11 ``asyncio.wait_for`` returns its inner result
instead of raising when the cancellation lands in the same loop turn as that result (CPython
gh-86296, fixed in 3.12); redis-py sends every command through it. The cancelled loop then goes
on as if nothing happened, and ``task.cancel(); await task`` waits for it forever: a worker
stopped by SIGTERM hung in its cleanup this way now and then. So a task that is still running
a moment after its cancellation is cancelled again (the next one lands on its next await),
and after the bound it is left behind rather than waited for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

log = logging.getLogger(__name__)

STOP_BOUND_S = 0.5
"""How long background tasks get to end once cancelled: they only sleep or await I/O."""
_RECANCEL_S = 0.05
"""How long a cancelled task may run on before it is cancelled again."""


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], bound_s: float = STOP_BOUND_S) -> None:
    """Cancel ``tasks`` and wait until they end, at most ``bound_s``.

    Never raises for the tasks: a task that ended with an error, or one still running at the
    bound, is logged by name (stopping must go on).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    tasks = set(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(_RECANCEL_S, remaining))
    for task in tasks - pending:
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())
    if pending:
        names = ", ".join(sorted(task.get_name() for task in pending))
        log.warning("background tasks did not stop within %.1f s; left behind: %s", bound_s, names)


async def finish_within(step: Awaitable[None], bound_s: float) -> bool:
    """Run one shutdown ``step`` for at most ``bound_s``, then cancel it; whether it completed
    (an error it raised is raised here).

    Run as a task of its own, so the bound does not depend on the step honouring a
    cancellation, and the caller's task is never cancelled by it.
    """
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({task}, timeout=bound_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        task.result()
        return True
    await stop_tasks({task})
    return False
