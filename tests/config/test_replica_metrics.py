"""The settings of replica load scraping: defaults, and errors that name the field."""

from __future__ import annotations

import pytest

from titan.config import config_from_mapping
from titan.errors import ConfigError


def upstream(**metrics) -> dict:
    deployment = {"backend": "openai", "base_url": "https://vllm.internal:8443/v1"}
    return {"models": [{"name": "llama", "deployments": [{**deployment, **metrics}]}]}


def error(mapping: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(mapping, "titan.yaml")
    return caught.value.message


def test_defaults_scrape_nothing_until_a_deployment_asks():
    config = config_from_mapping(upstream(), "titan.yaml")
    assert config.models[0].deployments[0].metrics is None
    load = config.routing.load
    assert (load.interval_s, load.jitter, load.stale_after_s) == (0.5, 0.2, 3.0)


def test_a_metrics_block_defaults_to_vllm_at_the_origin():
    config = config_from_mapping(upstream(metrics={}), "titan.yaml")
    metrics = config.models[0].deployments[0].metrics
    assert metrics.enabled and metrics.server == "vllm"
    assert (
        metrics.resolved_url("https://vllm.internal:8443/v1")
        == "https://vllm.internal:8443/metrics"
    )


def test_bad_settings_name_their_field():
    assert "server" in error(upstream(metrics={"server": "triton"}))
    assert "metrics.url" in error(upstream(metrics={"url": "vllm:8000/metrics"}))
    assert "waiting_requests" in error(upstream(metrics={"names": {"waiting_requests": "q"}}))
    message = error({"routing": {"load": {"interval_s": 2, "stale_after_s": 1}}})
    assert "routing.load" in message and "stale_after_s" in message
