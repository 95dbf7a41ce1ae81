"""Every Prometheus metric Titan exports, defined in one place.

One ``TitanMetrics`` per app (its own registry, no global state), rendered by ``/metrics``. Labels
are bounded: models come from the config (or the upstream's list), tenants from the config's
``tenants`` (any other tenant is counted as "other"), reasons and actions from fixed sets.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase

OTHER_TENANT = "other"


class TitanMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, known_tenants: frozenset[str] = frozenset()):
        self.registry = CollectorRegistry(auto_describe=True)
        self.known_tenants = known_tenants
        # labels() costs microseconds on every call; the label sets are few and bounded.
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
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

    def inc(self, metric: Counter, *labels: str, amount: float = 1.0) -> None:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        child.inc(amount)  # type: ignore[attr-defined]

    def tenant_label(self, tenant: str | None) -> str:
        if tenant is None:
            return "none"
        return tenant if tenant in self.known_tenants else OTHER_TENANT

    def render(self) -> bytes:
        return generate_latest(self.registry)
