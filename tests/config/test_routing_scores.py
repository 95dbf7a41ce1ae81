"""The scoring router's settings: defaults, and bad values named by their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from titan.config import load_config
from titan.errors import ConfigError


def load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "titan.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_scored_routing_and_a_deployment_cache_size(tmp_path: Path) -> None:
    path = tmp_path / "titan.yaml"
    path.write_text(
        "routing: {policy: scored, scored: {weights: {prefix: 5}, debug_header: true}}\n"
        "models: [{name: m, deployments: [{backend: simulated, prefix_cache_blocks: 100}]}]\n"
    )
    config = load_config(path)
    scored = config.routing.scored
    assert (scored.weights.prefix, scored.weights.queue, scored.debug_header) == (5, 4, True)
    assert scored.prefix.block_chars == 256 and scored.tie_break == "random"
    assert config.models[0].deployments[0].prefix_cache_blocks == 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "routing: {scored: {weights: {prefix: 0, queue: 0, kv: 0, latency: 0}}}",
            "routing.scored.weights: at least one of prefix, queue, kv, latency must be > 0",
        ),
        ("routing: {scored: {weights: {queue: -1}}}", "routing.scored.weights.queue: must be >= 0"),
        ("routing: {scored: {kv_full: 1.5}}", "routing.scored.kv_full: must be <= 1"),
        ("routing: {scored: {prefix: {block_chars: 4}}}", "routing.scored.prefix.block_chars"),
        ("routing: {scored: {tie_break: last}}", "routing.scored.tie_break: expected one of"),
        (
            "models: [{name: m, deployments: [{backend: simulated, prefix_cache_blocks: 0}]}]",
            "models[0].deployments[0].prefix_cache_blocks: must be >= 1",
        ),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in load_error(tmp_path, text)
