"""Under `serve --workers N`, /metrics answers for every worker: each worker's samples labelled
with its place, a family's HELP and TYPE once, and a sibling that cannot answer whole left out
of that scrape, never breaking it (the end-to-end behaviour is in tests/test_workers.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.shared_state.worker_mesh import MeshPlace
from gateway.telemetry.pod_metrics import PodMetrics, _Labelled, merge


def _worker_registry(requests: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("gateway_requests", "Requests.", ["pool"], registry=registry)
    counter.labels("small").inc(requests)
    Histogram("gateway_ttft_seconds", "TTFT.", ["pool"], registry=registry).labels("small").observe(
        0.1
    )
    return registry


def test_merged_expositions_keep_every_workers_samples_under_one_header() -> None:
    texts = [generate_latest(_Labelled(_worker_registry(n), str(i))) for i, n in enumerate((3, 5))]
    merged = merge(texts).decode()
    assert merged.count("# HELP gateway_requests_total ") == 1
    assert merged.count("# TYPE gateway_ttft_seconds histogram") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    requests = {s.labels["worker"]: s.value for s in families["gateway_requests"].samples}
    assert requests == {"0": 3.0, "1": 5.0}
    counts = [s for s in families["gateway_ttft_seconds"].samples if s.name.endswith("_count")]
    assert sorted(s.labels["worker"] for s in counts) == ["0", "1"]


async def test_a_sibling_cut_off_mid_answer_is_left_out_and_the_scrape_stays_whole(
    tmp_path: Path,
) -> None:
    place = MeshPlace(tmp_path, workers=2, index=0)

    async def killed_mid_write(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((1000).to_bytes(8, "big") + b"# HELP gateway_requests_total Req")
        await writer.drain()
        writer.close()  # as a worker SIGKILLed while answering

    sibling = await asyncio.start_unix_server(
        killed_mid_write, path=str(place.metrics_socket_path(1))
    )
    try:
        pod = PodMetrics(place, _worker_registry(7))
        families = {
            f.name: f for f in text_string_to_metric_families((await pod.exposition()).decode())
        }
    finally:
        sibling.close()
    requests = families["gateway_requests"].samples
    assert [(s.labels["worker"], s.value) for s in requests] == [("0", 7.0)]
