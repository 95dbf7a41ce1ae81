"""Metrics of live state, read when Prometheus scrapes: each deployment's circuit breaker and
attempt counts, each model's hedges and fallbacks, and the embedded engines' own counters (KV
cache usage, preemptions, prefix cache queries and hits, steps). They come from the pipeline's
``stats()`` snapshot, a plain dict, so nothing is counted twice on the request path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
# Engine counter -> (metric, help); vLLM's names with vllm: -> titan_.
ENGINE_COUNTERS = {
    "num_preemptions": ("titan_num_preemptions", "Sequences preempted by the engine."),
    "num_prompt_tokens": (
        "titan_prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "num_cached_prompt_tokens": (
        "titan_prefix_cache_hits", "Prompt tokens the prefix cache served."),
    "num_shifted_tokens": (
        "titan_context_shift_tokens",
        "Prompt tokens whose KV a context shift copied from their conversation's last turn."),
    "num_generated_tokens": ("titan_engine_generation_tokens", "Tokens the engine generated."),
    "num_steps": ("titan_engine_steps", "Engine steps (one batch through the model each)."),
    "num_requests_aborted": ("titan_engine_requests_aborted", "Engine requests aborted."),
}  # fmt: skip
ENGINE_GAUGES = {
    "kv_cache_usage": ("titan_kv_cache_usage_perc", "KV cache usage (1 = full)."),
    "num_running": ("titan_engine_num_requests_running", "Sequences in the engine's batch."),
    "num_waiting": ("titan_engine_num_requests_waiting", "Sequences waiting in the engine."),
}
# What an upstream model server last reported (a deployment's ``load``; absent when stale).
REPLICA_GAUGES = {
    "waiting": ("titan_replica_num_requests_waiting", "Requests the model server queues."),
    "running": ("titan_replica_num_requests_running", "Requests in the model server's batch."),
    "kv_usage": ("titan_replica_kv_cache_usage_perc", "The model server's KV cache usage."),
    "prefix_hit_rate": (
        "titan_replica_prefix_cache_hit_rate", "Share of prompt tokens its prefix cache served."),
}  # fmt: skip


class LiveState:
    """A collector over ``snapshot()`` (``Pipeline.stats``: model -> its counters and
    deployments)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []  # described by collecting: the families depend on what is deployed

    def collect(self) -> Iterator[Metric]:
        models = self.snapshot()
        per_model = ("model",)
        per_deployment = ("model", "deployment")
        hedges = CounterMetricFamily("titan_hedges", "Hedged attempts started.", labels=per_model)
        fallbacks = CounterMetricFamily(
            "titan_fallbacks", "Requests served by a fallback model.", labels=per_model
        )
        attempts = CounterMetricFamily(
            "titan_attempts", "Attempts sent to a deployment, by outcome.",
            labels=(*per_deployment, "outcome"),
        )  # fmt: skip
        breaker = GaugeMetricFamily(
            "titan_circuit_state", "A deployment's circuit breaker: 0 closed, 1 half-open, 2 open.",
            labels=per_deployment,
        )  # fmt: skip
        outstanding = GaugeMetricFamily(
            "titan_deployment_outstanding", "Attempts in flight to a deployment.",
            labels=per_deployment,
        )  # fmt: skip
        engine_counters = {
            key: CounterMetricFamily(name, text, labels=per_deployment)
            for key, (name, text) in ENGINE_COUNTERS.items()
        }
        engine_gauges = {
            key: GaugeMetricFamily(name, text, labels=per_deployment)
            for key, (name, text) in ENGINE_GAUGES.items()
        }
        replica_gauges = {
            key: GaugeMetricFamily(name, text, labels=per_deployment)
            for key, (name, text) in REPLICA_GAUGES.items()
        }
        scrape_failures = CounterMetricFamily(
            "titan_replica_scrape_failures", "Failed scrapes of a model server's metrics.",
            labels=per_deployment,
        )  # fmt: skip
        for model, stats in models.items():
            hedges.add_metric([model], stats.get("hedges", 0))
            fallbacks.add_metric([model], stats.get("served_as_fallback", 0))
            for name, deployment in stats.get("deployments", {}).items():
                labels = [model, name]
                successes, failures = deployment["successes"], deployment["failures"]
                attempts.add_metric([*labels, "success"], successes)
                attempts.add_metric([*labels, "failure"], failures)
                breaker.add_metric(labels, BREAKER_STATES.get(deployment["state"], 0))
                outstanding.add_metric(labels, deployment["outstanding"])
                backend = deployment.get("backend") or {}
                for key, family in engine_counters.items():
                    if key in backend:
                        family.add_metric(labels, backend[key])
                for key, family in engine_gauges.items():
                    if key in backend:
                        family.add_metric(labels, backend[key])
                load = deployment.get("load")
                if load is not None:
                    scrape_failures.add_metric(labels, load["failures"])
                    current = load["current"] or {}
                    for key, family in replica_gauges.items():
                        if current.get(key) is not None:
                            family.add_metric(labels, current[key])
        yield from (hedges, fallbacks, attempts, breaker, outstanding)
        yield from engine_counters.values()
        yield from engine_gauges.values()
        yield from replica_gauges.values()
        yield scrape_failures


class SemanticBudgetState:
    """The semantic cache's error budget per model, read at each scrape from
    ``ErrorBudget.report`` (titan/cache/error_budget.py)."""

    def __init__(self, report: Callable[[], dict[str, dict[str, Any]]]):
        self.report = report

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ("model",)
        gauges = {
            "estimated_error_rate": GaugeMetricFamily(
                "titan_cache_semantic_error_rate",
                "Share of verified semantic hits (at the learned threshold) answered wrong.",
                labels=labels,
            ),
            "error_rate_upper_bound": GaugeMetricFamily(
                "titan_cache_semantic_error_bound",
                "95% upper bound of the semantic hits' error rate (kept under max_error_rate).",
                labels=labels,
            ),
            "threshold": GaugeMetricFamily(
                "titan_cache_semantic_threshold",
                "Similarity from which semantic hits are served (absent: none served yet).",
                labels=labels,
            ),
        }
        counters = {
            "served": ("titan_cache_semantic_served", "Semantic hits served under the budget."),
            "verifications": (
                "titan_cache_semantic_verifications",
                "Would-be semantic hits that ran the model and compared the answers.",
            ),
            "extra_model_calls": (
                "titan_cache_semantic_extra_calls",
                "Verifications of hits that would otherwise have been served (their cost).",
            ),
        }
        counter_families = {
            key: CounterMetricFamily(name, text, labels=labels)
            for key, (name, text) in counters.items()
        }
        for model, row in self.report().items():
            for key, family in gauges.items():
                if row.get(key) is not None:
                    family.add_metric([model], float(row[key]))
            for key, family in counter_families.items():
                family.add_metric([model], float(row.get(key, 0)))
        yield from gauges.values()
        yield from counter_families.values()
