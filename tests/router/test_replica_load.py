"""The model servers' own load, read from their Prometheus text as each server prints it."""

from __future__ import annotations

import pytest

from tests.router.expositions import SGLANG, TGI, VLLM, VLLM_V0
from titan.config import DeploymentMetrics, MetricNames
from titan.observability.collectors import LiveState
from titan.observability.metrics import TitanMetrics
from titan.router.replica_load import SERVER_METRICS, Exposition, metric_names, parse_exposition


def read(text: str, server: str, model_name: str | None = None) -> Exposition:
    return parse_exposition(text, SERVER_METRICS[server], model_name)  # type: ignore[index]


def test_vllm_sums_counts_over_engines_and_averages_the_kv_usage():
    found = read(VLLM, "vllm")
    assert (found.waiting, found.running) == (4.0, 22.0)  # not the _max series sharing a prefix
    assert found.kv_usage == pytest.approx(0.375)
    assert (found.prefix_hits, found.prefix_queries) == (4000.0, 10000.0)
    assert found.prefix_hit_rate is None


def test_older_vllm_names_are_read_when_the_new_ones_are_absent():
    found = read(VLLM_V0, "vllm")
    assert (found.waiting, found.running, found.kv_usage) == (0.0, 4.0, 0.125)
    assert found.prefix_hit_rate == 0.75
    assert found.prefix_hits is None


def test_sglang():
    found = read(SGLANG, "sglang")
    assert (found.waiting, found.running, found.kv_usage) == (2.0, 7.0, 0.42)
    assert found.prefix_hit_rate == 0.6


def test_tgi_has_no_kv_usage():
    found = read(TGI, "tgi")
    assert (found.waiting, found.running) == (5.0, 16.0)
    assert found.kv_usage is None and found.prefix_hit_rate is None


def test_titan_reads_its_own_exposition():
    """Titan's names as Titan really prints them (the collector over an engine's stats)."""
    engine = {"kv_cache_usage": 0.3, "num_running": 2, "num_waiting": 1,
              "num_prompt_tokens": 800, "num_cached_prompt_tokens": 200}  # fmt: skip
    stats = {"m": {"deployments": {"m-0": {"successes": 0, "failures": 0, "state": "closed",
                                           "outstanding": 0, "backend": engine}}}}  # fmt: skip
    metrics = TitanMetrics()
    metrics.watch(LiveState(lambda: stats))
    found = read(metrics.render().decode(), "titan", model_name="m")
    assert (found.waiting, found.running, found.kv_usage) == (1.0, 2.0, 0.3)
    assert (found.prefix_hits, found.prefix_queries) == (200.0, 800.0)
    assert read(metrics.render().decode(), "titan", model_name="other").running is None


def test_a_model_name_selects_its_series():
    two_models = VLLM + 'vllm:num_requests_running{model_name="facebook/opt-125m"} 4.0\n'
    assert read(two_models, "vllm").running == 22.0 + 4.0
    assert read(two_models, "vllm", "facebook/opt-125m").running == 4.0
    assert read(two_models, "vllm", "meta-llama/Llama-3.1-8B-Instruct").running == 22.0


def test_a_deployment_names_its_own_metrics_over_the_servers():
    metrics = DeploymentMetrics(server="tgi", names=MetricNames(kv_usage="my_kv_ratio"))
    names = metric_names(metrics)
    assert names.waiting == ("tgi_queue_size",)  # the server's, kept
    assert names.kv_usage == ("my_kv_ratio",)  # one name is accepted for a list
    found = parse_exposition(TGI + "my_kv_ratio 0.9\n", names)
    assert (found.waiting, found.kv_usage) == (5.0, 0.9)


def test_nan_values_are_ignored_and_garbage_is_refused():
    assert read("vllm:kv_cache_usage_perc NaN\n", "vllm").kv_usage is None
    with pytest.raises(ValueError):
        read("vllm:num_requests_waiting{ this is not prometheus\n", "vllm")
    assert read("<html>not found</html>\n", "vllm") == Exposition()
