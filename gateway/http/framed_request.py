"""A completion request the front (gateway/http/front.py) framed, as the gateway serves it."""

from __future__ import annotations

import asyncio
import time

from multidict import CIMultiDictProxy

from gateway.http.request_body import Endpoint


class Request:
    """A completion request the front framed: its endpoint, headers and body."""

    __slots__ = ("body", "endpoint", "headers", "started", "task")

    def __init__(self, endpoint: Endpoint, headers: CIMultiDictProxy[str], body: bytes) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.body = body
        self.started = time.perf_counter()
        self.task: asyncio.Task[None] | None = None
        """The task serving it (asyncio.current_task() would cost a getpid() per request)."""
