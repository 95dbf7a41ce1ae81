"""Every Prometheus metric Titan exports, defined in one place.

One ``TitanMetrics`` per app (its own registry, no global state), rendered by ``/metrics``. Labels
are bounded: models come from the config (or the upstream's list), tenants from the config's
``tenants`` (any other tenant is counted as "other"), reasons and actions from fixed sets.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from titan.observability.records import RequestRecord

OTHER_TENANT = "other"
# vLLM's buckets, so that dashboards and alerts written for vLLM read the same histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
# vLLM's end-to-end buckets start at 0.3 s; a gateway also answers from its cache and refuses in
# milliseconds, so finer ones come first (quantile queries written for vLLM work the same).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                   10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                   7680.0)  # fmt: skip
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                 60.0)  # fmt: skip
# prometheus-client's multi-process mode: each process writes its values here, /metrics sums.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class TitanMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, known_tenants: frozenset[str] = frozenset()):
        self.registry = CollectorRegistry(auto_describe=True)
        self._live: list[Any] = []  # collectors of live state (engines, breakers, jobs)
        self.known_tenants = known_tenants
        # labels() costs microseconds on every call; the label sets are few and bounded.
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
        self._request_children: dict[str, _RequestChildren] = {}
        r = self.registry
        self.admitted = Counter(
            "titan_admission_admitted", "Requests admitted.", ["model", "priority"], registry=r
        )
        self.queued = Counter(
            "titan_admission_queued",
            "Requests that waited in the admission queue before a slot.",
            ["model", "priority"],
            registry=r,
        )
        self.refused = Counter(
            "titan_admission_refused",
            "Requests refused or dropped by admission, by reason (the error code).",
            ["model", "reason"],
            registry=r,
        )
        self.degraded = Counter(
            "titan_degraded",
            "Requests answered in a degraded way, by action.",
            ["model", "action"],
            registry=r,
        )
        self.waiting = Gauge(
            "titan_num_requests_waiting", "Requests in the admission queue.", ["model"], registry=r
        )
        self.running = Gauge(
            "titan_num_requests_running",
            "Requests holding an admission slot.",
            ["model"],
            registry=r,
        )
        self.degradation_level = Gauge(
            "titan_degradation_level", "Steps of the degradation ladder applied.", ["model"],
            registry=r,
        )  # fmt: skip
        self.cache_lookups = Counter(
            "titan_cache_lookups",
            "Response cache lookups by result (hit-exact, hit-semantic, miss).",
            ["model", "result"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "titan_prompt_tokens", "Prompt tokens served.", ["model", "tenant"], registry=r
        )
        self.generation_tokens = Counter(
            "titan_generation_tokens", "Generated tokens served.", ["model", "tenant"], registry=r
        )
        self.cost_usd = Counter(
            "titan_cost_usd", "Cost of the served tokens (config prices).", ["model", "tenant"],
            registry=r,
        )  # fmt: skip
        # ---- per request (vLLM's names, vllm: -> titan_) ------------------------------------
        self.requests = Counter(
            "titan_requests", "Requests finished, by model and HTTP status.", ["model", "status"],
            registry=r,
        )  # fmt: skip
        self.request_success = Counter(
            "titan_request_success", "Requests answered (status 200).", ["model"], registry=r
        )
        self.e2e_latency = Histogram(
            "titan_e2e_request_latency_seconds", "End-to-end request latency.", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "titan_time_to_first_token_seconds",
            "Time to the first token (to the whole answer when not streamed).",
            ["model"], buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.inter_token_latency = Histogram(
            "titan_inter_token_latency_seconds", "Gaps between streamed tokens.", ["model"],
            buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "titan_request_queue_time_seconds", "Time waiting for an admission slot.", ["model"],
            buckets=QUEUE_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "titan_retries", "Attempts after the first, across deployments.", ["model"],
            registry=r,
        )  # fmt: skip
        self.goodput = Counter(
            "titan_goodput_requests",
            "Requests answered within their SLO (time to first token, end to end, token gaps).",
            ["model", "tenant"], registry=r,
        )  # fmt: skip
        self.storage_errors = Counter(
            "titan_storage_errors",
            "Storage calls that failed because the store was unreachable, by component (limits, "
            "auth, budget, cache, usage, ready).",
            ["component"], registry=r,
        )  # fmt: skip
        self.guardrail_hits = Counter(
            "titan_guardrail_hits",
            "Requests a guardrail policy matched, by policy, stage (input, output) and action "
            "(block, redact, flag); counted once per request and stage.",
            ["policy", "stage", "action"], registry=r,
        )  # fmt: skip
        self.jobs = Gauge(
            "titan_jobs", "Jobs in the queue by state.", ["state"], registry=r,
            multiprocess_mode="mostrecent",
        )  # fmt: skip

    def inc(self, metric: Counter, *labels: str, amount: float = 1.0) -> None:
        self._child(metric, *labels).inc(amount)  # type: ignore[attr-defined]

    def tenant_label(self, tenant: str | None) -> str:
        if tenant is None:
            return "none"
        return tenant if tenant in self.known_tenants else OTHER_TENANT

    def observe(self, record: RequestRecord, slo: Any) -> None:
        """One finished request: counts, latencies, and goodput against ``slo`` (ttft_s, e2e_s,
        inter_token_s; None: not judged)."""
        model = record.model or "unknown"
        if record.status != 200:  # failures only count: no latency series for them
            self.inc(self.requests, model, str(record.status))
            return
        children = self._request_children.get(model)
        if children is None:
            children = self._request_children[model] = _RequestChildren(self, model)
        children.ok.inc()
        children.success.inc()
        observe_one(children.e2e_latency, record.total_s or 0.0)
        if record.ttft_s is not None:
            observe_one(children.ttft, record.ttft_s)
        if record.queue_s is not None:
            observe_one(children.queue_time, record.queue_s)
        if record.inter_token_s:
            observe_many(children.inter_token_latency, record.inter_token_s)
        if record.num_attempts > 1:
            children.retries.inc(record.num_attempts - 1)
        if meets_slo(record, slo):
            self.inc(self.goodput, model, self.tenant_label(record.tenant))

    def _child(self, metric: MetricWrapperBase, *labels: str) -> MetricWrapperBase:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def watch(self, collector: Any) -> None:
        """A collector of live state, read at each scrape (``collect()`` yields metric
        families)."""
        self.registry.register(collector)
        self._live.append(collector)

    def render(self) -> bytes:
        """The exposition text. Under several worker processes (``PROMETHEUS_MULTIPROC_DIR``
        set), the counters and histograms of all of them, summed, plus this one's live state."""
        path = os.environ.get(MULTIPROC_ENV)
        if not path:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=path)
        for collector in self._live:
            merged.register(collector)
        return generate_latest(merged)


class _RequestChildren:
    """A model's labelled children of the per-request metrics, looked up once: a request
    touches up to seven of them."""

    def __init__(self, metrics: TitanMetrics, model: str):
        self.ok = metrics.requests.labels(model, "200")
        self.success = metrics.request_success.labels(model)
        self.e2e_latency = metrics.e2e_latency.labels(model)
        self.ttft = metrics.ttft.labels(model)
        self.queue_time = metrics.queue_time.labels(model)
        self.inter_token_latency = metrics.inter_token_latency.labels(model)
        self.retries = metrics.retries.labels(model)


def observe_one(histogram: Any, value: float) -> None:
    """``observe``, with the bucket found by bisection (the client scans its buckets)."""
    bounds = getattr(histogram, "_upper_bounds", None)
    if bounds is None:
        histogram.observe(value)
        return
    histogram._buckets[bisect.bisect_left(bounds, value)].inc(1)
    histogram._sum.inc(value)


def observe_many(histogram: Any, values: list[float]) -> None:
    """``observe`` of each value, with one increment per bucket found by bisection: the
    client's own observe scans the buckets in Python (25 of them here) and takes a lock per
    value, and a stream's token gaps are counted in one pass when it ends. Uses the client's
    bucket list when it has one (it has since 0.4), else observes one by one."""
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    if buckets is None or bounds is None:
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(buckets)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    for index, count in enumerate(counts):
        if count:
            buckets[index].inc(count)
    histogram._sum.inc(sum(values))


def meets_slo(record: RequestRecord, slo: Any) -> bool:
    if record.status != 200 or slo is None:
        return record.status == 200
    checks: Iterable[tuple[float | None, float | None]] = (
        (record.ttft_s, slo.ttft_s),
        (record.total_s, slo.e2e_s),
        (_mean(record.inter_token_s), slo.inter_token_s),
    )
    return all(limit is None or value is None or value <= limit for value, limit in checks)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
