"""Stopping background tasks: bounded, and loud about a task that would not stop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.background import stop_tasks


async def _stubborn(release: asyncio.Event) -> None:
    """Swallows every cancellation, as a loop whose cancellation was lost goes on running,
    until released."""
    while not release.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            continue


async def test_a_task_that_ignores_cancellation_is_left_behind_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    stubborn = asyncio.create_task(_stubborn(release), name="stubborn round")
    obedient = asyncio.create_task(asyncio.sleep(60), name="obedient round")
    with caplog.at_level(logging.WARNING, logger="gateway.background"):
        await asyncio.wait_for(stop_tasks({stubborn, obedient}, bound_s=0.2), timeout=5)
    assert obedient.cancelled()
    assert not stubborn.done()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "stubborn round" in warnings[0]
    assert "obedient round" not in warnings[0]
    release.set()
    await stubborn


async def test_tasks_that_stop_leave_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    tasks = {asyncio.create_task(asyncio.sleep(60), name=f"round {i}") for i in range(3)}
    with caplog.at_level(logging.WARNING, logger="gateway.background"):
        await stop_tasks(tasks)
    assert all(task.cancelled() for task in tasks)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
