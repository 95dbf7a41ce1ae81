"""TitanConfig, its mapping onto the engine's config, and the `titan serve` flags."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from titan.backends.embedded import engine_config
from titan.cli import main as cli_main
from titan.config import EmbeddedDeployment, EmbeddedModelConfig, TitanConfig, parse_byte_size
from titan.errors import ConfigError


def embedded_engine(config: TitanConfig) -> EmbeddedModelConfig:
    """The engine settings of the config's one embedded deployment (the flags' target)."""
    (model,) = config.models
    (deployment,) = model.deployments
    assert isinstance(deployment, EmbeddedDeployment)
    return deployment.engine


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        ("64 kib", 64 * 1024),
    ],
)
def test_parse_byte_size(text: str, expected: int) -> None:
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "2 parsecs", "-1GiB", "1e9"])
def test_parse_byte_size_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="byte size"):
        parse_byte_size(text)


def test_config_is_frozen_and_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="extra"):
        TitanConfig.model_validate({"server": {"hots": "0.0.0.0"}})
    config = TitanConfig()
    with pytest.raises(ValidationError):
        config.server.port = 1  # type: ignore[misc]


def test_engine_config_takes_only_what_was_set() -> None:
    engine = engine_config(EmbeddedModelConfig(kv_cache_bytes="1GiB", max_num_seqs=8))
    assert engine.kv_cache_bytes == 1024**3 and engine.max_num_seqs == 8
    assert engine.block_size == 16 and engine.model is None  # the engine's defaults


def test_engine_config_errors_surface_as_config_errors() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        engine_config(EmbeddedModelConfig(block_size=3))


def test_build_config_from_flags() -> None:
    config = cli_main.serve_settings(
        host="0.0.0.0",
        port=9000,
        log_level="DEBUG",
        model="/models/x.gguf",
        kv_cache_memory="512MiB",
        max_model_len=256,
        num_threads=1,
        attention_precision="float32",
        environ={},
    ).config
    assert config.server.host == "0.0.0.0" and config.server.port == 9000
    assert config.server.log_level == "debug"
    engine = embedded_engine(config)
    assert engine.model == "/models/x.gguf"
    assert engine.kv_cache_bytes == 512 * 1024**2
    assert engine.max_model_len == 256 and engine.num_threads == 1
    assert engine.attention_precision == "float32"


def test_build_config_names_the_bad_flag() -> None:
    with pytest.raises(ConfigError, match="--max-num-seqs"):
        cli_main.serve_settings(max_num_seqs=0, environ={})
    with pytest.raises(ConfigError, match="--port"):
        cli_main.serve_settings(port=70000, environ={})
    with pytest.raises(ConfigError, match="--kv-cache-memory: invalid byte size"):
        cli_main.serve_settings(kv_cache_memory="lots", environ={})
    with pytest.raises(ConfigError, match=r"--attention-precision.*'auto' or 'float32'"):
        cli_main.serve_settings(attention_precision="int8", environ={})


def test_serve_passes_flags_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[TitanConfig] = []
    monkeypatch.setattr(cli_main, "run_server", lambda settings: seen.append(settings.config) or 0)
    result = CliRunner().invoke(
        cli_main.build_cli(),
        ["serve", "--port", "8123", "--max-num-seqs", "4", "--served-model-name", "smol"],
    )
    assert result.exit_code == 0, result.output
    (config,) = seen
    assert config.server.port == 8123 and config.server.host == "127.0.0.1"
    engine = embedded_engine(config)
    assert engine.max_num_seqs == 4 and engine.served_model_name == "smol"


def test_serve_refuses_bad_flags_with_a_message() -> None:
    result = CliRunner().invoke(cli_main.build_cli(), ["serve", "--kv-cache-memory", "lots"])
    assert result.exit_code == 2
    assert "byte size" in result.output


def test_serve_exit_code_follows_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_main, "run_server", lambda settings: 1)
    assert CliRunner().invoke(cli_main.build_cli(), ["serve"]).exit_code == 1


def test_help_lists_serve() -> None:
    result = CliRunner().invoke(cli_main.build_cli(), ["--help"])
    assert result.exit_code == 0 and "serve" in result.output
