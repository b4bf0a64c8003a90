"""The replica's /metrics, under vLLM's own series names so a scraper cannot tell the difference.

Gauges and counters are read from the engine at scrape time (the engine is the one source of
truth); the latency histograms are fed as requests finish.
"""

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replica import vllm_metrics as vm
from replica.sim.engine import Engine, FinishedRequest

# vLLM's bucket boundaries, so that histogram_quantile over sim and real replicas agrees.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# Reported even at zero so that rate() works from the first scrape.
FINISH_REASONS = ("stop", "length")


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterable[Metric]:
        engine = self._engine
        config = engine.config
        model = [config.model]

        stats = engine.stats
        gauges = (
            (vm.NUM_RUNNING, "Requests in model execution batches.",
             engine.num_running),
            (vm.NUM_WAITING, "Requests waiting to be processed.",
             engine.num_waiting),
            (vm.KV_USAGE, "KV-cache usage. 1 means 100 percent usage.",
             engine.kv_usage()),
        )  # fmt: skip
        counters = (
            (vm.PREFIX_CACHE_QUERIES,
             "Prefix cache queries, in terms of number of queried tokens.",
             stats.prefix_cache_queries),
            (vm.PREFIX_CACHE_HITS,
             "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_cache_hits),
            (vm.PROMPT_TOKENS, "Number of prefill tokens processed.", stats.prompt_tokens),
            (vm.GENERATION_TOKENS, "Number of generation tokens processed.",
             stats.generation_tokens),
            # vLLM registers these with or without a KV connector (0 without).
            (vm.EXTERNAL_PREFIX_CACHE_QUERIES,
             "Prompt tokens looked up in the CPU tier (those the GPU cache missed).",
             stats.external_queries),
            (vm.EXTERNAL_PREFIX_CACHE_HITS, "Prompt tokens loaded back from the CPU tier.",
             stats.external_hits),
            ("sim_requests_aborted", "Requests aborted because the client went away.",
             stats.aborted),
        )  # fmt: skip
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(model, value)
            yield gauge
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(model, value)
            yield counter

        success = CounterMetricFamily(
            vm.REQUEST_SUCCESS,
            "Count of successfully processed requests.",
            labels=["model_name", "finished_reason"],
        )
        reasons = dict.fromkeys(FINISH_REASONS, 0) | stats.finished
        for reason, count in reasons.items():
            success.add_metric([config.model, reason], count)
        yield success

        # Like vLLM's, this info gauge carries the cache config in labels and no model_name.
        info = GaugeMetricFamily(
            vm.CACHE_CONFIG,
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        info.add_metric([str(config.block_size), str(config.num_blocks), "True"], 1.0)
        yield info


class SimMetrics:
    """The metrics of one replica, in a registry of its own (several apps may share a process)."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self._model = engine.config.model
        self._ttft = Histogram(
            vm.TTFT,
            "Histogram of time to first token in seconds.",
            ["model_name"],
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        self._e2e = Histogram(
            vm.E2E_LATENCY,
            "Histogram of end to end request latency in seconds.",
            ["model_name"],
            registry=self.registry,
            buckets=E2E_BUCKETS,
        )
        engine.add_finish_listener(self._observe)

    def _observe(self, record: FinishedRequest) -> None:
        self._ttft.labels(model_name=self._model).observe(record.ttft_s)
        self._e2e.labels(model_name=self._model).observe(record.e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
