"""The live dashboard's numbers: every second, what changed since the second before.

The metrics are cumulative (counters, histogram buckets); a chart wants rates and percentiles of
the last interval. ``Dashboard`` reads the metrics registry and the pipeline's ``stats()`` once
per interval, turns the differences into one sample (requests, errors and refusals per second,
p50/p99 of end-to-end latency and time to first token from the histograms' bucket deltas, the
cache hit rate) plus the live state at that moment (queue depth, running requests, the engines'
batch and KV-cache usage), and keeps the last five minutes of samples. It runs in the pipeline's
process and reads that process's metrics only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

INTERVAL_S = 1.0
NUM_SAMPLES = 300  # five minutes at one a second
# The metric families read (prometheus-client's family names: counters without ``_total``).
REQUESTS = "titan_requests"
REFUSED = "titan_admission_refused"
CACHE_LOOKUPS = "titan_cache_lookups"
LATENCY = "titan_e2e_request_latency_seconds"
TTFT = "titan_time_to_first_token_seconds"
HISTOGRAMS = (LATENCY, TTFT)
# A deployment's health as the page shows it, from its circuit breaker.
HEALTH = {"closed": "healthy", "half_open": "probing", "open": "ejected"}


@dataclass
class Totals:
    """Cumulative counts at one moment, all models summed."""

    requests: float = 0.0
    errors: float = 0.0  # finished with a status other than 2xx
    refusals: float = 0.0  # refused or dropped by admission
    cache_lookups: float = 0.0
    cache_hits: float = 0.0
    # histogram name -> {bucket upper bound: cumulative count}; and the sum of its observations
    buckets: dict[str, dict[float, float]] = field(
        default_factory=lambda: {name: {} for name in HISTOGRAMS}
    )
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HISTOGRAMS, 0.0))


def read_totals(families: Iterable[Metric]) -> Totals:
    """The totals of the families Titan's metrics registry yields (others are ignored)."""
    totals = Totals()
    for family in families:
        name = family.name
        for sample in family.samples:
            if sample.name == f"{REQUESTS}_total":
                totals.requests += sample.value
                if not sample.labels.get("status", "").startswith("2"):
                    totals.errors += sample.value
            elif sample.name == f"{REFUSED}_total":
                totals.refusals += sample.value
            elif sample.name == f"{CACHE_LOOKUPS}_total":
                totals.cache_lookups += sample.value
                if sample.labels.get("result", "").startswith("hit"):
                    totals.cache_hits += sample.value
            elif name in HISTOGRAMS and sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                counts = totals.buckets[name]
                counts[bound] = counts.get(bound, 0.0) + sample.value
            elif name in HISTOGRAMS and sample.name == f"{name}_sum":
                totals.sums[name] += sample.value
    return totals


def bucket_deltas(
    before: dict[float, float], after: dict[float, float]
) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the observations between two reads, by bound."""
    deltas: list[tuple[float, float]] = []
    running_max = 0.0
    for bound in sorted(after):
        # max(): a label set that vanished between the reads must not make counts go down.
        running_max = max(running_max, after[bound] - before.get(bound, 0.0))
        deltas.append((bound, running_max))
    return deltas


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of a histogram's cumulative buckets, interpolated linearly within the
    bucket it falls in, as Prometheus' ``histogram_quantile`` does: None without observations;
    the highest finite bound when it falls in the +Inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def rates(before: Totals, after: Totals, elapsed_s: float) -> dict[str, float | None]:
    """The interval's rates, percentiles and means (seconds); None where nothing was observed.
    The percentiles are only as fine as the buckets (interpolated within one); the means are
    exact."""

    def per_s(field_name: str) -> float:
        delta = getattr(after, field_name) - getattr(before, field_name)
        return round(max(delta, 0.0) / elapsed_s, 3)

    lookups = after.cache_lookups - before.cache_lookups
    hits = after.cache_hits - before.cache_hits
    sample: dict[str, float | None] = {
        "requests_per_s": per_s("requests"),
        "errors_per_s": per_s("errors"),
        "refusals_per_s": per_s("refusals"),
        "cache_hit_rate": round(hits / lookups, 4) if lookups > 0 else None,
    }
    for key, name in (("latency", LATENCY), ("ttft", TTFT)):
        deltas = bucket_deltas(before.buckets[name], after.buckets[name])
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            value = quantile(q, deltas)
            sample[f"{key}_{label}_s"] = None if value is None else round(value, 5)
        count = deltas[-1][1] if deltas else 0.0
        total_s = after.sums[name] - before.sums[name]
        sample[f"{key}_mean_s"] = round(max(total_s, 0.0) / count, 5) if count > 0 else None
    return sample


def read_state(models: dict[str, Any]) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """The live gauges of ``Pipeline.stats()`` (summed over models; KV-cache usage: the fullest
    engine's) and one row per deployment. The engine's batch and KV cache are None when no
    embedded engine serves."""
    waiting = running = 0
    batch: int | None = None
    kv_usage: float | None = None
    rows = []
    for model, stats in models.items():
        queue = (stats.get("admission") or {}).get("queue") or {}
        waiting += queue.get("waiting") or 0
        running += queue.get("running") or 0
        for name, deployment in (stats.get("deployments") or {}).items():
            backend = deployment.get("backend") or {}  # {} while the backend is not ready
            if "num_running" in backend:
                batch = (batch or 0) + backend["num_running"]
            if "kv_cache_usage" in backend:
                kv_usage = max(kv_usage or 0.0, float(backend["kv_cache_usage"]))
            state = deployment.get("state", "closed")
            rows.append(
                {
                    "model": model,
                    "deployment": name,
                    "health": HEALTH.get(state, state) if backend else "loading",
                    "breaker": state,
                    "last_breaker_reason": deployment.get("last_breaker_reason"),
                    "breaker_openings": deployment.get("breaker_openings", 0),
                    "outstanding": deployment.get("outstanding", 0),
                    "attempts": deployment.get("attempts", 0),
                    "successes": deployment.get("successes", 0),
                    "failures": deployment.get("failures", 0),
                    "ewma_ttfb_s": deployment.get("ewma_ttfb_s"),
                    "kv_cache_usage": backend.get("kv_cache_usage"),
                    "engine_running": backend.get("num_running"),
                }
            )
    gauges: dict[str, float | None] = {
        "queue_depth": waiting,
        "running": running,
        "engine_batch": batch,
        "kv_cache_usage": None if kv_usage is None else round(kv_usage, 4),
    }
    return gauges, rows


class Dashboard:
    """Samples ``collect()`` (metric families) and ``stats()`` (``Pipeline.stats``) every
    ``interval_s`` once started, keeping the last ``num_samples`` samples.

    A sample: ``t`` (Unix time, seconds), ``requests_per_s``, ``errors_per_s``,
    ``refusals_per_s``, ``latency_p50_s``, ``latency_p99_s``, ``latency_mean_s``,
    ``ttft_p50_s``, ``ttft_p99_s``, ``ttft_mean_s``, ``cache_hit_rate``, ``queue_depth``,
    ``running``, ``engine_batch``, ``kv_cache_usage``.
    """

    def __init__(
        self,
        collect: Callable[[], Iterable[Metric]],
        stats: Callable[[], dict[str, Any]],
        *,
        interval_s: float = INTERVAL_S,
        num_samples: int = NUM_SAMPLES,
        now: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ):
        self._collect = collect
        self._stats = stats
        self.interval_s = interval_s
        self._now = now
        self._clock = clock
        self.samples: deque[dict[str, Any]] = deque(maxlen=num_samples)
        self.models: list[str] = []
        self.deployments: list[dict[str, Any]] = []
        self._previous: tuple[float, Totals] | None = None  # the last read: when, and totals
        self._task: asyncio.Task[None] | None = None

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Take the baseline now and sample every interval from here on (idempotent)."""
        if self._task is not None:
            return
        self.sample()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        due = self._now()
        while True:
            due += self.interval_s
            await asyncio.sleep(max(0.0, due - self._now()))
            if self._now() - due > self.interval_s:  # after a stall, no burst of samples
                due = self._now()
            try:
                self.sample()
            except Exception:  # a bad read must not end the sampling
                logger.exception("dashboard sample failed")

    def sample(self) -> dict[str, Any] | None:
        """Read the totals and the live state now; append and return the sample of what changed
        since the last read (the first read only sets the baseline and returns None)."""
        at = self._now()
        totals = read_totals(self._collect())
        models = self._stats()
        gauges, self.deployments = read_state(models)
        self.models = list(models)
        previous, self._previous = self._previous, (at, totals)
        if previous is None or at <= previous[0]:
            return None
        sample = {
            "t": round(self._clock(), 3),
            **rates(previous[1], totals, at - previous[0]),
            **gauges,
        }
        self.samples.append(sample)
        return sample

    def data(self, since: float | None = None) -> dict[str, Any]:
        """What the page polls: the samples after ``since`` (all kept when None), the models
        and the deployments as of the last sample."""
        samples = [s for s in self.samples if since is None or s["t"] > since]
        return {
            "interval_s": self.interval_s,
            "models": self.models,
            "deployments": self.deployments,
            "samples": samples,
        }
