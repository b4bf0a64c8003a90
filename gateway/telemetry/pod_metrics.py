"""`serve --workers N`: /metrics answers for every worker of the pod, whichever one a scrape
reaches.

Each worker counts what it serves, and the kernel hands a scrape to any one of them: read
alone, a worker's counters would jump between the workers' values from one scrape to the next
and `rate()` would see a share of the traffic. So each worker serves its exposition, every
sample already labelled ``worker`` (its place, 0 to N-1, which a replacement keeps), to its
siblings on a Unix socket in the run's private directory; the worker a scrape reaches reads
its siblings' concurrently and answers with every worker's series, a family's samples under
one HELP and TYPE. Prometheus adds them up as it adds up pods: ``sum by (pool)
(rate(...))``. Families every worker reads from one page the parent shares (the workers
replaced) come once, from the worker scraped, without the label.

Merging is text work (lines grouped by family), not parsing: a scrape of many workers and
replicas must not stall the streams the scraped worker relays. A sibling that does not answer
whole within ``SIBLING_TIMEOUT_S`` (a replacement still starting, a worker killed mid-answer,
a hung one the parent is about to kill) is left out of that scrape; its counters are whole
again at the next. One process (no ``--workers``) has none of this: its /metrics is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.shared_state.worker_mesh import MeshPlace
from gateway.telemetry.metrics import WORKERS_REPLACED

log = logging.getLogger(__name__)

WORKER_LABEL = "worker"
SIBLING_TIMEOUT_S = 2.0
"""How long a scrape waits for a sibling's exposition: a worker writes its own in about a
millisecond, and Prometheus's default scrape timeout (10 s) leaves room for a slow one."""
POD_WIDE = frozenset((WORKERS_REPLACED,))
"""Families whose value every worker reads from the parent's shared page: one copy, unlabelled
(summing them over workers would count each replacement N times)."""
_LENGTH = struct.Struct("!Q")
"""Each answer's length first: an answer cut short (its worker killed mid-write) is told from
a whole one and left out, not merged as a broken line that would fail the whole scrape."""


class PodMetrics:
    """This worker's exposition served to its siblings, and theirs read for a scrape."""

    def __init__(self, place: MeshPlace, own: CollectorRegistry) -> None:
        self._place = place
        self._labelled = _Labelled(own, str(place.index))
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        path = self._place.metrics_socket_path(self._place.index)
        # A replaced worker's socket file is still there: binding needs the name free.
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._answer_sibling, path=str(path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer_sibling(
        self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        text = generate_latest(self._labelled.without_pod_wide())
        with contextlib.suppress(ConnectionError):
            writer.write(_LENGTH.pack(len(text)) + text)
            await writer.drain()
        writer.close()

    async def exposition(self) -> bytes:
        """Every worker's series, each labelled with its worker."""
        place = self._place
        siblings = [i for i in range(place.workers) if i != place.index]
        texts = await asyncio.gather(*(self._read_sibling(i) for i in siblings))
        own = generate_latest(self._labelled)
        return merge([own, *(text for text in texts if text is not None)])

    async def _read_sibling(self, index: int) -> bytes | None:
        path = self._place.metrics_socket_path(index)
        try:
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                    return await reader.readexactly(length)
                finally:
                    writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning(
                "metrics: worker %d did not answer (%r); left out of this scrape", index, exc
            )
            return None


def merge(texts: list[bytes]) -> bytes:
    """Expositions of the same families (the same code wrote them) as one: each family's HELP
    and TYPE once, from the first text that has it, then its samples from every text in turn."""
    blocks: dict[bytes, list[bytes]] = {}
    for text in texts:
        block: list[bytes] = []
        first = False
        for line in text.splitlines(keepends=True):
            if line.startswith(b"# HELP "):
                name = line.split(b" ", 3)[2]
                first = name not in blocks
                block = blocks.setdefault(name, [])
                if first:
                    block.append(line)
            elif line.startswith(b"# TYPE "):
                if first:
                    block.append(line)
            else:
                block.append(line)
    return b"".join(line for block in blocks.values() for line in block)


class _Labelled(Collector):
    """A registry's families with every sample labelled with one worker's place; pod-wide
    families as they are."""

    def __init__(self, registry: CollectorRegistry, worker: str, pod_wide: bool = True) -> None:
        self._registry = registry
        self._worker = worker
        self._pod_wide = pod_wide

    def without_pod_wide(self) -> _Labelled:
        return _Labelled(self._registry, self._worker, pod_wide=False)

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.name in POD_WIDE:
                if self._pod_wide:
                    yield family
                continue
            family.samples = [
                s._replace(labels={**s.labels, WORKER_LABEL: self._worker}) for s in family.samples
            ]
            yield family
