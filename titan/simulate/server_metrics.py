"""The simulated model server's ``/metrics``, under vLLM's names, so that whatever scrapes a
vLLM fleet (Titan's router, a dashboard) reads a simulated one unchanged.

One registry per server (no global state); gauges are read from the server when scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from titan.simulate.model_server import ModelServer, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets for TTFT and end-to-end latency (seconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class _Gauges:
    """Live state at scrape time: the queues and the KV cache."""

    def __init__(self, server: ModelServer, model_name: str):
        self._server = server
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        server = self._server
        for name, documentation, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", len(server.running)),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(server.waiting)),
            ("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", server.pool.usage),
        ):
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric([self._model_name], value)
            yield gauge
        preemptions = CounterMetricFamily(
            "vllm:num_preemptions", "Cumulative preemptions.", labels=["model_name"]
        )
        preemptions.add_metric([self._model_name], server.num_preemptions)
        yield preemptions


class ServerMetrics:
    """A ServerRecorder (see model_server) that keeps vLLM's counters and histograms."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self._model_name = model_name
        labels = ["model_name"]

        def counter(name: str, documentation: str) -> Counter:
            metric = Counter(name, documentation, labels, registry=self.registry)
            return metric.labels(model_name)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, documentation, labels, registry=self.registry, buckets=buckets)
            return metric.labels(model_name)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self.successes = counter("vllm:request_success", "Finished requests.")
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time in the waiting queue.", E2E_BUCKETS
        )

    def watch(self, server: ModelServer) -> None:
        self.registry.register(_Gauges(server, self._model_name))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # ---- ServerRecorder -------------------------------------------------------------------

    def on_admitted(self, sequence: Sequence, num_cached_tokens: int) -> None:
        self.prefix_queries.inc(sequence.num_tokens)
        self.prefix_hits.inc(num_cached_tokens)

    def on_first_token(self, sequence: Sequence) -> None:
        self.prompt_tokens.inc(sequence.num_prompt_tokens)
        self.ttft.observe(sequence.first_token_s - sequence.arrival_s)
        self.queue_time.observe(sequence.scheduled_s - sequence.arrival_s)

    def on_tokens(self, num_tokens: int) -> None:
        if num_tokens:
            self.generation_tokens.inc(num_tokens)

    def on_finished(self, sequence: Sequence) -> None:
        self.successes.inc()
        self.e2e.observe(sequence.finish_s - sequence.arrival_s)
