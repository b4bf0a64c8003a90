"""`serve --workers N`: /metrics answers for every worker of the pod, whichever one a scrape
reaches.

Each worker counts what it serves. A scrape reached one worker, so a counter read through the
pod's port jumped between the workers' own values from one scrape to the next, and `rate()`
saw a fraction of the traffic (or counter resets that were none). Now each worker also serves
its own exposition to its siblings on a Unix socket in the run's private directory; the worker
a scrape reaches reads its siblings' concurrently, parses each with prometheus_client's parser
and answers with every worker's series, each labelled ``worker`` (its place, 0 to N-1, which a
replacement keeps). Prometheus adds them up as it adds up pods: ``sum by (pool) (rate(...))``.
Families every worker reads from one page the parent shares (the workers replaced) are answered
once, from the worker scraped, without the label.

A sibling that does not answer within ``SIBLING_TIMEOUT_S`` (a replacement still starting, a
hung worker the parent is about to kill) is left out of that scrape; its counters are whole
again at the next. One process (no ``--workers``) has none of this: its /metrics is its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
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


def socket_path(place: MeshPlace, index: int) -> Path:
    return place.directory / f"metrics-{index}.sock"


class PodMetrics:
    """This worker's exposition served to its siblings, and theirs read for a scrape."""

    def __init__(self, place: MeshPlace, own: Collector) -> None:
        self._place = place
        self._own = own
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        path = socket_path(self._place, self._place.index)
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
        with contextlib.suppress(ConnectionError):
            writer.write(generate_latest(self._own))
            await writer.drain()
        writer.close()

    async def exposition(self) -> bytes:
        """Every worker's series, each labelled with its worker."""
        place = self._place
        siblings = [i for i in range(place.workers) if i != place.index]
        texts = await asyncio.gather(*(self._read_sibling(i) for i in siblings))
        by_worker = {i: text for i, text in zip(siblings, texts, strict=True) if text is not None}
        by_worker[place.index] = generate_latest(self._own)
        return generate_latest(_Families(merge(by_worker, place.index)))

    async def _read_sibling(self, index: int) -> bytes | None:
        path = socket_path(self._place, index)
        try:
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            log.warning(
                "metrics: worker %d did not answer (%r); left out of this scrape", index, exc
            )
            return None


def merge(texts: dict[int, bytes], scraped: int) -> list[Metric]:
    """The workers' expositions as one: each sample labelled with its worker, families of one
    name merged; a pod-wide family taken from the worker ``scraped`` alone."""
    families: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode()):
            if family.name in POD_WIDE:
                if index == scraped:
                    families[family.name] = family
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type
                )
            merged.samples.extend(
                s._replace(labels={**s.labels, WORKER_LABEL: str(index)}) for s in family.samples
            )
    return list(families.values())


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families
