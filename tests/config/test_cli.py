"""`titan config check` and what the `titan serve` flags (--config, --upstream, --model) build."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from titan.cli import main as cli_main
from titan.config import EmbeddedDeployment, OpenAIDeployment, TitanConfig
from titan.errors import ConfigError

SECRET = "sk-cli-secret-value-7"

TWO_UPSTREAMS = """
models:
  - name: llama
    deployments:
      - {backend: openai, base_url: "http://a:8000/v1", api_key: "${KEY}"}
      - {backend: openai, base_url: "http://b:8000/v1", api_key: "${KEY}"}
"""

ONE_EMBEDDED = """
server: {port: 8001}
models:
  - name: smol
    deployments: [{backend: embedded, engine: {max_num_seqs: 4, dtype: float32}}]
"""


def invoke(args: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli_main.build_cli(), args, env=env)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "titan.yaml"
    path.write_text(text)
    return path


def test_config_check_prints_the_summary_and_ok(tmp_path: Path) -> None:
    result = invoke(["config", "check", str(write(tmp_path, TWO_UPSTREAMS))], {"KEY": SECRET})
    assert result.exit_code == 0, result.output
    assert "- llama-0: openai http://a:8000/v1, api key ***, weight 1" in result.stdout
    assert result.stdout.rstrip().endswith("OK")
    assert SECRET not in result.output


def test_config_check_lists_the_problems_and_exits_1(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_UPSTREAMS.replace("base_url", "base_ulr", 1))
    result = invoke(["config", "check", str(path)], {"KEY": SECRET})
    assert result.exit_code == 1
    assert f"{path}: models[0].deployments[0].base_ulr: unknown key 'base_ulr'" in result.stderr
    assert f"{path}: models[0].deployments[0].base_url: required key is missing" in result.stderr
    assert "Traceback" not in result.output and "OK" not in result.stdout
    assert SECRET not in result.output


def test_config_check_reports_unset_variables_and_missing_files(tmp_path: Path) -> None:
    path = write(tmp_path, TWO_UPSTREAMS)
    result = invoke(["config", "check", str(path)], {"KEY": ""})
    assert result.exit_code == 0  # set, though empty: that is the user's business
    result = CliRunner().invoke(
        cli_main.build_cli(), ["config", "check", str(tmp_path / "nope.yaml")]
    )
    assert result.exit_code == 1 and "nope.yaml: no such file" in result.stderr


def test_no_file_means_the_embedded_model_with_the_engine_flags() -> None:
    config = cli_main.serve_settings(model="/m.gguf", dtype="float32", environ={}).config
    (model,) = config.models
    (deployment,) = model.deployments
    assert model.name is None and isinstance(deployment, EmbeddedDeployment)
    assert deployment.engine.model == "/m.gguf" and deployment.engine.dtype == "float32"
    assert cli_main.serve_settings(environ={}).config == TitanConfig()


def test_upstream_without_model_serves_every_upstream_model() -> None:
    config = cli_main.serve_settings(
        upstream="http://vllm:8000/v1/", environ={"TITAN_UPSTREAM_API_KEY": SECRET}
    ).config
    (model,) = config.models
    (deployment,) = model.deployments
    assert model.name == "*"
    assert isinstance(deployment, OpenAIDeployment)
    assert deployment.base_url == "http://vllm:8000/v1" and deployment.upstream_model is None
    assert deployment.api_key is not None and deployment.api_key.get_secret_value() == SECRET


def test_upstream_with_model_serves_that_model() -> None:
    config = cli_main.serve_settings(
        upstream="http://vllm:8000/v1", model="meta-llama/Llama-3.1-8B", api_key="k", environ={}
    ).config
    (model,) = config.models
    (deployment,) = model.deployments
    assert model.name == "meta-llama/Llama-3.1-8B"
    assert isinstance(deployment, OpenAIDeployment)
    assert deployment.api_key is not None and deployment.api_key.get_secret_value() == "k"
    no_key = cli_main.serve_settings(upstream="http://vllm:8000/v1", environ={}).config
    assert isinstance(no_key.models[0].deployments[0], OpenAIDeployment)
    assert no_key.models[0].deployments[0].api_key is None


def test_upstream_flag_combinations_that_make_no_sense_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--dtype set the embedded engine; not with --upstream"):
        cli_main.serve_settings(upstream="http://u/v1", dtype="float32", environ={})
    with pytest.raises(ConfigError, match=r"--api-key .* needs --upstream"):
        cli_main.serve_settings(api_key="k", environ={})
    with pytest.raises(ConfigError, match="--config and --upstream cannot be combined"):
        cli_main.serve_settings(
            config_file=write(tmp_path, ONE_EMBEDDED), upstream="http://u/v1", environ={}
        )
    with pytest.raises(ConfigError, match=r"^--upstream: .*base_url must start with http"):
        cli_main.serve_settings(upstream="vllm:8000", environ={})


def test_engine_flags_set_a_files_only_embedded_deployment(tmp_path: Path) -> None:
    config = cli_main.serve_settings(
        config_file=write(tmp_path, ONE_EMBEDDED), max_num_seqs=8, environ={}
    ).config
    (deployment,) = config.models[0].deployments
    assert isinstance(deployment, EmbeddedDeployment)
    assert deployment.engine.max_num_seqs == 8 and deployment.engine.dtype == "float32"
    assert config.models[0].name == "smol"


def test_engine_flags_are_refused_without_exactly_one_embedded_deployment(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, TWO_UPSTREAMS)
    with pytest.raises(ConfigError, match=r"--dtype, --max-num-seqs set the embedded engine.*0"):
        cli_main.serve_settings(
            config_file=path, dtype="float32", max_num_seqs=2, environ={"KEY": "k"}
        )


def test_flags_beat_environment_which_beats_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, ONE_EMBEDDED)
    environ = {"TITAN_SERVER__PORT": "9000", "TITAN_SERVER__HOST": "0.0.0.0"}
    assert cli_main.serve_settings(config_file=path, environ={}).config.server.port == 8001
    from_env = cli_main.serve_settings(config_file=path, environ=environ).config
    assert from_env.server.port == 9000 and from_env.server.host == "0.0.0.0"
    from_flag = cli_main.serve_settings(config_file=path, port=9100, environ=environ).config
    assert from_flag.server.port == 9100 and from_flag.server.host == "0.0.0.0"


def test_serve_with_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[TitanConfig] = []
    monkeypatch.setattr(cli_main, "run_server", lambda settings: seen.append(settings.config) or 0)
    path = write(tmp_path, TWO_UPSTREAMS)
    result = invoke(["serve", "--config", str(path), "--port", "8124"], {"KEY": SECRET})
    assert result.exit_code == 0, result.output
    (config,) = seen
    assert config.server.port == 8124 and [m.name for m in config.models] == ["llama"]


def test_serve_refuses_a_bad_config_file_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {prot: 1}\n")
    result = invoke(["serve", "--config", str(path)])
    assert result.exit_code == 2
    assert f"titan serve: {path}: server.prot: unknown key 'prot'" in result.stderr
    assert "Traceback" not in result.output


def test_serve_upstream_takes_its_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[TitanConfig] = []
    monkeypatch.setattr(cli_main, "run_server", lambda settings: seen.append(settings.config) or 0)
    result = invoke(
        ["serve", "--upstream", "http://vllm:8000/v1", "--model", "llama"],
        {"TITAN_UPSTREAM_API_KEY": SECRET},
    )
    assert result.exit_code == 0, result.output
    (deployment,) = seen[0].models[0].deployments
    assert seen[0].models[0].name == "llama"
    assert isinstance(deployment, OpenAIDeployment) and deployment.api_key is not None
    assert deployment.api_key.get_secret_value() == SECRET


def test_serve_help_explains_both_meanings_of_model() -> None:
    result = invoke(["serve", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())  # undo the help's box and wrapping
    assert "Without --upstream: the embedded model" in text
    assert "With --upstream: the upstream's model to serve" in text


def test_the_cli_lists_config_and_simulate() -> None:
    result = invoke(["--help"])
    assert "config" in result.output and "simulate" in result.output
