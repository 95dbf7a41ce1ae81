"""The dashboard's sampler: rates and percentiles from the deltas of known counters and
histogram buckets, the live gauges and deployment rows, the five-minute ring, and its task's
lifecycle (started on first use, stopped by the pipeline's shutdown)."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.clock import ManualClock
from titan.config import config_from_mapping
from titan.observability.metrics import TitanMetrics
from titan.service import Pipeline
from titan.service.dashboard import Dashboard, bucket_deltas, quantile, read_state
from titan.storage import Storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits

EPOCH = 1_800_000_000.0


def sampler(metrics: TitanMetrics, clock: ManualClock, stats=dict, **kwargs) -> Dashboard:
    return Dashboard(
        metrics.registry.collect, stats, now=clock, clock=lambda: EPOCH + clock(), **kwargs
    )


def finish(metrics: TitanMetrics, status: str, latency_s: float | None = None, n: int = 1) -> None:
    for _ in range(n):
        metrics.requests.labels("sim", status).inc()
        if latency_s is not None:
            metrics.e2e_latency.labels("sim").observe(latency_s)


def test_quantile_interpolates_within_the_bucket():
    buckets = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (math.inf, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * 40 / 50)
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 39 / 40)
    assert quantile(0.05, buckets) == pytest.approx(0.05)  # the first bucket starts at 0


def test_quantile_edges():
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # Beyond the last finite bound: the bound itself, as histogram_quantile answers.
    assert quantile(0.99, [(1.0, 1.0), (2.0, 1.0), (math.inf, 10.0)]) == 2.0
    # Empty buckets below the rank are skipped, not interpolated into.
    assert quantile(0.5, [(1.0, 0.0), (2.0, 0.0), (4.0, 2.0), (math.inf, 2.0)]) == 3.0


def test_bucket_deltas_never_go_down():
    before = {0.5: 5.0, 1.0: 7.0, math.inf: 7.0}
    after = {0.5: 6.0, 1.0: 6.0, math.inf: 9.0}  # 1.0's count fell: a label set went away
    assert bucket_deltas(before, after) == [(0.5, 1.0), (1.0, 1.0), (math.inf, 2.0)]


def test_rates_and_percentiles_come_from_the_interval_only():
    metrics, clock = TitanMetrics(), ManualClock(0.0)
    finish(metrics, "200", latency_s=50.0, n=100)  # before the baseline: never shown
    dashboard = sampler(metrics, clock)
    assert dashboard.sample() is None  # the baseline
    assert not dashboard.samples

    finish(metrics, "200", latency_s=0.4, n=8)  # all in the (0.3, 0.5] bucket
    finish(metrics, "503", n=2)
    metrics.refused.labels("sim", "queue_full").inc(3)
    metrics.cache_lookups.labels("sim", "hit-exact").inc(2)
    metrics.cache_lookups.labels("sim", "hit-semantic").inc(1)
    metrics.cache_lookups.labels("sim", "miss").inc(1)
    for _ in range(4):
        metrics.ttft.labels("sim").observe(0.015)  # the (0.01, 0.02] bucket
    clock.now = 2.0
    sample = dashboard.sample()

    assert sample is not None and dashboard.samples[-1] == sample
    assert sample["t"] == EPOCH + 2.0
    assert sample["requests_per_s"] == 5.0  # 10 requests in 2 s
    assert sample["errors_per_s"] == 1.0
    assert sample["refusals_per_s"] == 1.5
    assert sample["cache_hit_rate"] == 0.75
    assert sample["latency_p50_s"] == pytest.approx(0.3 + 0.2 * 4 / 8)
    assert sample["latency_p99_s"] == pytest.approx(0.3 + 0.2 * 7.92 / 8, abs=1e-5)
    assert sample["ttft_p50_s"] == pytest.approx(0.015)
    assert sample["latency_mean_s"] == pytest.approx(0.4)  # exact, unlike the percentiles
    assert sample["ttft_mean_s"] == pytest.approx(0.015)

    clock.now = 3.0  # a quiet second
    quiet = dashboard.sample()
    assert quiet is not None
    assert quiet["requests_per_s"] == quiet["errors_per_s"] == quiet["refusals_per_s"] == 0.0
    assert quiet["latency_p50_s"] is quiet["latency_p99_s"] is quiet["ttft_p99_s"] is None
    assert quiet["cache_hit_rate"] is quiet["latency_mean_s"] is None


def test_the_live_state_and_the_deployment_rows():
    stats = {
        "a": {
            "admission": {"queue": {"waiting": 3, "running": 4}},
            "deployments": {
                "a-0": {
                    "state": "closed",
                    "outstanding": 2,
                    "attempts": 9,
                    "successes": 8,
                    "failures": 1,
                    "ewma_ttfb_s": 0.2,
                    "last_breaker_reason": None,
                    "breaker_openings": 0,
                    "backend": {"num_running": 5, "kv_cache_usage": 0.25},
                },
                "a-1": {
                    "state": "open",
                    "outstanding": 0,
                    "attempts": 4,
                    "successes": 0,
                    "failures": 4,
                    "ewma_ttfb_s": None,
                    "last_breaker_reason": "5 failures",
                    "breaker_openings": 1,
                    "backend": {"num_running": 1, "kv_cache_usage": 0.5},
                },
            },
        },
        "b": {
            "admission": {"queue": {"waiting": 1, "running": 0}},
            "deployments": {
                "b-0": {"state": "half_open", "outstanding": 0, "backend": {"requests": 1}},
                "b-1": {"state": "closed", "outstanding": 0, "backend": {}},  # still loading
            },
        },
    }
    gauges, rows = read_state(stats)
    assert gauges == {"queue_depth": 4, "running": 4, "engine_batch": 6, "kv_cache_usage": 0.5}
    health = {row["deployment"]: (row["health"], row["breaker"]) for row in rows}
    assert health == {
        "a-0": ("healthy", "closed"),
        "a-1": ("ejected", "open"),
        "b-0": ("probing", "half_open"),
        "b-1": ("loading", "closed"),
    }
    assert rows[1]["last_breaker_reason"] == "5 failures" and rows[1]["failures"] == 4
    # No embedded engine anywhere: no batch and no KV cache to show.
    no_engine, _ = read_state({"b": stats["b"]})
    assert no_engine["engine_batch"] is None and no_engine["kv_cache_usage"] is None

    clock = ManualClock(0.0)
    dashboard = sampler(TitanMetrics(), clock, stats=lambda: stats)
    dashboard.sample()
    clock.now = 1.0
    assert dashboard.sample()["queue_depth"] == 4  # type: ignore[index]
    data = dashboard.data()
    assert data["models"] == ["a", "b"] and len(data["deployments"]) == 4


def test_the_ring_keeps_the_last_samples_and_since_filters():
    clock = ManualClock(0.0)
    dashboard = sampler(TitanMetrics(), clock, num_samples=3)
    for second in range(6):
        clock.now = float(second)
        dashboard.sample()
    times = [s["t"] for s in dashboard.data()["samples"]]
    assert times == [EPOCH + 3, EPOCH + 4, EPOCH + 5]
    assert [s["t"] for s in dashboard.data(since=EPOCH + 4)["samples"]] == [EPOCH + 5]
    assert dashboard.data(since=EPOCH + 5)["samples"] == []


async def test_it_samples_in_the_background_until_stopped():
    metrics = TitanMetrics()
    dashboard = Dashboard(metrics.registry.collect, dict, interval_s=0.01)
    dashboard.start()
    dashboard.start()  # twice is harmless: one sampler
    assert dashboard.is_running
    await asyncio.sleep(0.1)
    assert len(dashboard.samples) >= 2
    await dashboard.stop()
    assert not dashboard.is_running
    await dashboard.stop()  # twice is harmless


async def test_the_pipeline_shutdown_stops_the_dashboard():
    config = config_from_mapping(
        {
            "models": [{"name": "sim", "deployments": [{"backend": "simulated"}]}],
            "probes": {"enabled": False},
        },
        "test config",
    )
    storage = Storage("memory://", MemoryDocuments(), MemoryCounters(), MemoryLimits())
    pipeline = Pipeline(config, storage=storage)
    await pipeline.start()
    dashboard = pipeline.dashboard
    dashboard.start()
    assert dashboard.is_running
    assert dashboard.models == ["sim"]
    assert dashboard.deployments[0]["health"] == "healthy"
    await pipeline.shutdown()
    assert not dashboard.is_running
