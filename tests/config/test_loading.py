"""Config files → TitanConfig: messages that name file, key path and fix; ${VAR} references;
TITAN_ overrides; secrets kept out of every message and summary."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from titan.config import EmbeddedDeployment, OpenAIDeployment, TitanConfig, loading
from titan.config.loading import Override, config_from_mapping, describe, load_config
from titan.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-very-secret-value-42"


def write(tmp_path: Path, text: str, name: str = "titan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(path: Path, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ or {})
    return caught.value.message


UPSTREAM = """
models:
  - name: llama
    deployments:
      - backend: openai
        base_url: http://vllm:8000/v1
        api_key: "${VLLM_API_KEY}"
"""


def test_a_minimal_file_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, UPSTREAM), {"VLLM_API_KEY": SECRET})
    (deployment,) = config.models[0].deployments
    assert isinstance(deployment, OpenAIDeployment)
    assert deployment.base_url == "http://vllm:8000/v1"
    assert deployment.api_key is not None and deployment.api_key.get_secret_value() == SECRET


def test_an_empty_file_means_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing yet\n"), {}) == TitanConfig()


def test_unknown_keys_are_named_with_file_path_and_suggestion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
server:
  hots: 0.0.0.0
models:
  - name: llama
    deployments:
      - backend: openai
        base_url: http://a:8000/v1
      - backend: openai
        base_url: http://b:8000/v1
        api_kye: x
retyr: {max_attempts: 2}
""",
    )
    lines = load_error(path).splitlines()
    assert f"{path}: server.hots: unknown key 'hots'; did you mean 'host'?" in lines
    assert (
        f"{path}: models[0].deployments[1].api_kye: unknown key 'api_kye'; did you mean 'api_key'?"
        in lines
    )
    assert f"{path}: retyr: unknown key 'retyr'; did you mean 'retry'?" in lines
    assert len(lines) == 3  # one ConfigError, every problem listed


def test_unknown_keys_without_a_close_match_list_the_allowed_ones(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "hedge: {zzz: 1}\n"))
    assert "hedge.zzz: unknown key 'zzz' (allowed keys: enabled, percentile," in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: {port: abc}", "server.port: expected an integer, got 'abc'"),
        ("server: {port: 70000}", "server.port: must be <= 65535, got 70000"),
        ("retry: {max_attempts: 0}", "retry.max_attempts: must be >= 1, got 0"),
        ("hedge: {enabled: maybe}", "hedge.enabled: expected true or false, got 'maybe'"),
        ("routing: 5", "routing: expected a mapping of keys to values, got 5"),
        ("retry: {retry_on_status: [429, x]}", "retry.retry_on_status[1]: expected an integer"),
        (
            "routing: {policy: round_robbin}",
            "routing.policy: expected one of 'p2c_ewma', 'round_robin', 'least_outstanding', "
            "'session_affinity', 'prefix_affinity' or 'scored', got 'round_robbin'; "
            "did you mean 'round_robin'?",
        ),
        (
            "models: [{deployments: [{backend: embedded, engine: {kv_cache_bytes: lots}}]}]",
            "models[0].deployments[0].engine.kv_cache_bytes: invalid byte size 'lots'",
        ),
    ],
)
def test_wrong_types_and_values_name_what_was_expected(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text + "\n")
    assert f"{path}: {expected}" in load_error(path)


def test_backend_errors_list_the_backends(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models: [{name: m, deployments: [{backend: vllm, base_url: 'http://x'}, {}]}]\n",
    )
    message = load_error(path)
    backends = "one of 'embedded', 'openai', 'simulated'"
    assert f"{path}: models[0].deployments[0].backend: unknown backend 'vllm'; expected " in message
    assert f"{backends} (vLLM, SGLang, TGI, Ollama and llama.cpp servers are 'openai'" in message
    assert f"models[0].deployments[1].backend: required key is missing: {backends}" in message


def test_a_missing_required_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "models: [{name: m, deployments: [{backend: openai}]}]\n")
    assert f"{path}: models[0].deployments[0].base_url: required key is missing" in load_error(path)


def test_an_unset_variable_names_itself_the_key_path_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, UPSTREAM)
    message = load_error(path, {})
    assert message == (
        f"{path}: models[0].deployments[0].api_key: environment variable 'VLLM_API_KEY' is not "
        "set (write ${VLLM_API_KEY:-default} to give it a default)"
    )


def test_unset_variables_and_other_problems_are_reported_together(tmp_path: Path) -> None:
    path = write(tmp_path, UPSTREAM + "server: {port: '${PORT}', hots: x}\n")
    lines = load_error(path, {}).splitlines()
    assert any("'VLLM_API_KEY' is not set" in line for line in lines)
    assert any("server.port: environment variable 'PORT' is not set" in line for line in lines)
    assert any("unknown key 'hots'" in line for line in lines)
    # The empty value left where PORT was missing is not reported a second time.
    assert not any("server.port: expected" in line for line in lines)


def test_variable_defaults_and_escapes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
server:
  host: "${HOST:-0.0.0.0}"
  port: "${PORT:-9001}"
models:
  - name: "m-${SUFFIX}"
    deployments:
      - backend: openai
        base_url: "http://${UPSTREAM_HOST:-localhost}:8000/v1"
        headers: {X-Literal: "$${NOT_A_VARIABLE}"}
""",
    )
    config = load_config(path, {"PORT": "", "SUFFIX": "x", "UPSTREAM_HOST": "vllm"})
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 9001  # set but empty: the default, as in the shell
    assert config.models[0].name == "m-x"
    deployment = config.models[0].deployments[0]
    assert isinstance(deployment, OpenAIDeployment)
    assert deployment.base_url == "http://vllm:8000/v1"
    assert deployment.headers == {"X-Literal": "${NOT_A_VARIABLE}"}


@pytest.mark.parametrize("value", ["${1BAD}", "${A:default}", "${UNCLOSED"])
def test_malformed_references_are_errors(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f'server: {{host: "{value}"}}\n')
    message = load_error(path, {"A": "a"})
    assert message.startswith(f"{path}: server.host: ") and "reference" in message


def test_keys_yaml_reads_as_booleans_or_numbers_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "on: 1\nserver: {1: x}\n")
    lines = load_error(path).splitlines()
    assert lines == [
        f"{path}: (top level): key True is not a string; quote it (YAML reads unquoted on, off, "
        "yes and no as true or false)",
        f"{path}: server: key 1 is not a string; quote it (YAML reads unquoted on, off, yes and "
        "no as true or false)",
    ]


def test_the_environ_argument_is_the_only_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("TITAN_SERVER__PORT", "1234")
    path = write(tmp_path, UPSTREAM)
    assert "'VLLM_API_KEY' is not set" in load_error(path, {})
    assert load_config(path).server.port == 1234  # environ=None: os.environ, read at call time


def test_secrets_never_appear_in_messages(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
models:
  - name: llama
    deployments:
      - backend: openai
        base_url: not-a-url
        api_key: "${KEY}"
        api_kye: "${KEY}"
        headers: {Authorization: "Bearer ${KEY}", X-Bad: [1]}
      - backend: openai
        base_url: http://x/v1
        api_key: {nested: "${KEY}"}
      - backend: openai
        base_url: http://y/v1
        api_key: "inline-secret-in-the-file"
        weight: -1
""",
    )
    message = load_error(path, {"KEY": SECRET})
    assert len(message.splitlines()) == 5, message
    assert SECRET not in message and "inline-secret-in-the-file" not in message


def test_secrets_never_appear_in_describe_or_repr(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        UPSTREAM + "        headers: {Authorization: 'Bearer ${VLLM_API_KEY}'}\n",
    )
    config = load_config(path, {"VLLM_API_KEY": SECRET})
    summary = describe(config)
    assert "api key ***" in summary and "Authorization=***" in summary
    assert SECRET not in summary
    deployment = config.models[0].deployments[0]
    assert isinstance(deployment, OpenAIDeployment)
    assert SECRET not in repr(deployment.api_key) and SECRET not in str(deployment.api_key)


def test_describe_summarizes_models_and_settings() -> None:
    config = config_from_mapping(
        {
            "models": [
                {
                    "name": "big",
                    "deployments": [
                        {"backend": "openai", "base_url": "http://a/v1", "weight": 3},
                        {"backend": "simulated", "profile": {"spike_probability": 0.05}},
                    ],
                    "fallbacks": ["small"],
                },
                {"name": "small", "deployments": [{"backend": "embedded"}]},
            ],
            "hedge": {"enabled": False},
        },
        "test",
        {},
    )
    summary = describe(config)
    assert "- big-0: openai http://a/v1, api key none, weight 3" in summary
    assert "- big-1: simulated (seed 0, ttft 0.02s, spikes 5% x10), weight 1" in summary
    assert "fallbacks: small" in summary and "embedded bundled SmolLM2" in summary
    assert "routing: p2c_ewma" in summary and "hedge: off" in summary
    assert "retry: up to 3 attempts" in summary and "breaker: opens after 5" in summary


def test_titan_env_overrides_apply_on_top_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {port: 8001}\nretry: {max_attempts: 2}\n")
    environ = {
        "TITAN_SERVER__PORT": "9000",
        "TITAN_RETRY__MAX_ATTEMPTS": "5",
        "TITAN_HEDGE__ENABLED": "false",
        "TITAN_RETRY__RETRY_ON_STATUS": "[429, 503]",
        "TITAN_UPSTREAM_API_KEY": "not an override",  # no double underscore: left alone
    }
    config = load_config(path, environ)
    assert config.server.port == 9000 and config.retry.max_attempts == 5
    assert config.hedge.enabled is False and config.retry.retry_on_status == (429, 503)


def test_titan_env_overrides_apply_to_the_defaults() -> None:
    config = config_from_mapping(None, "defaults", {"TITAN_ROUTING__POLICY": "round_robin"})
    assert config.routing.policy == "round_robin"
    assert config.models == TitanConfig().models


def test_bad_titan_env_overrides_name_the_variable() -> None:
    environ = {
        "TITAN_SERVER__PROT": "1",
        "TITAN_SERVR__PORT": "2",
        "TITAN_MODELS__0__NAME": "x",
        "TITAN_HEDGE__PERCENTILE": "150",
    }
    lines = set(load_error_from_mapping(environ).splitlines())
    variable = "environment variable"
    assert (
        f"{variable} TITAN_SERVER__PROT: unknown key 'prot' in server; did you mean 'port'?"
        in lines
    )
    assert any(
        line.startswith(
            f"{variable} TITAN_SERVR__PORT: unknown section 'servr'; did you mean 'server'?"
        )
        for line in lines
    )
    assert any(
        line.startswith("environment variable TITAN_MODELS__0__NAME: unknown section")
        for line in lines
    )
    assert "environment variable TITAN_HEDGE__PERCENTILE: must be < 100.0, got 150" in lines


def load_error_from_mapping(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({}, "defaults", environ)
    return caught.value.message


def test_flags_come_last_and_their_problems_name_the_flag() -> None:
    environ = {"TITAN_SERVER__PORT": "8500"}
    flag = Override(("server", "port"), 9000, "--port")
    from_file = loading.layered_config({"server": {"port": 8100}}, "f", environ)
    assert from_file.config.server.port == 8500
    assert loading.layered_config(None, "f", environ, [flag]).config.server.port == 9000
    with pytest.raises(ConfigError, match=r"^--port: must be <= 65535, got 70000$"):
        loading.layered_config(None, "f", {}, [Override(("server", "port"), 70000, "--port")])


def test_json_files_by_extension_and_by_content(tmp_path: Path) -> None:
    text = '{"server": {"port": 8100}, "retry": {"max_attempts": 4}}'
    assert load_config(write(tmp_path, text, "titan.json"), {}).server.port == 8100
    assert load_config(write(tmp_path, text, "titan.conf"), {}).retry.max_attempts == 4
    bad = write(tmp_path, '{"server": {"port": 8100,}}', "bad.json")
    assert load_error(bad).startswith(f"{bad}:1:")
    assert "invalid JSON" in load_error(bad)
    unknown = write(tmp_path, '{"server": {"prot": 1}}', "unknown.json")
    assert f"{unknown}: server.prot: unknown key 'prot'; did you mean 'port'?" in load_error(
        unknown
    )


def test_invalid_yaml_gives_the_position_but_not_the_text(tmp_path: Path) -> None:
    path = write(tmp_path, f"models:\n  - api_key: {SECRET}\n   bad: [\n")
    message = load_error(path)
    assert message.startswith(f"{path}:") and "invalid YAML" in message
    assert SECRET not in message


def test_not_a_mapping_not_a_file(tmp_path: Path) -> None:
    listed = write(tmp_path, "- a\n- b\n")
    assert load_error(listed) == f"{listed}: expected a mapping of settings, got a list"
    assert load_error(tmp_path / "absent.yaml") == f"{tmp_path / 'absent.yaml'}: no such file"


def test_yaml_is_only_ever_safe_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = yaml.load
    loaders: list[type] = []

    def only_safe(stream: object, Loader: type) -> object:
        loaders.append(Loader)
        if Loader is not yaml.SafeLoader:
            raise AssertionError(f"yaml loaded with {Loader.__name__}")
        return real_load(stream, Loader)

    monkeypatch.setattr(yaml, "load", only_safe)
    assert load_config(write(tmp_path, "server: {port: 8002}\n"), {}).server.port == 8002
    assert loaders == [yaml.SafeLoader]
    # Python tags are what an unsafe loader would execute; the safe one refuses them.
    evil = write(tmp_path, "server: !!python/object/apply:os.system ['true']\n", "evil.yaml")
    assert "invalid YAML" in load_error(evil)
    for module in ("loading", "overrides"):
        source = inspect.getsource(getattr(__import__("titan.config", fromlist=[module]), module))
        assert "yaml.load(" not in source and "yaml.safe_load(" in source


def test_star_model_only_with_openai_deployments_and_never_a_target() -> None:
    star = {"name": "*", "deployments": [{"backend": "openai", "base_url": "http://u/v1"}]}
    config = config_from_mapping({"models": [star]}, "test", {})
    assert config.models[0].name == "*"
    with pytest.raises(ConfigError, match=r"test: models\[0\]: the model '\*'.*openai"):
        config_from_mapping(
            {"models": [{"name": "*", "deployments": [{"backend": "embedded"}]}]}, "test", {}
        )
    other = {"name": "m", "deployments": [{"backend": "simulated"}], "fallbacks": ["*"]}
    with pytest.raises(ConfigError, match=r"models\[1\]\.fallbacks\[0\]: the model '\*' cannot"):
        config_from_mapping({"models": [star, other]}, "test", {})


def test_references_to_models_are_checked() -> None:
    models = [
        {"name": "large", "deployments": [{"backend": "simulated"}], "fallbacks": ["smal"]},
        {"name": "small", "deployments": [{"backend": "simulated"}]},
    ]
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"models": models}, "f.yaml", {})
    assert caught.value.message == (
        "f.yaml: models[0].fallbacks[0]: unknown model 'smal'; did you mean 'small'?"
    )
    models[0]["fallbacks"] = ["large"]
    with pytest.raises(ConfigError, match="refers to itself"):
        config_from_mapping({"models": models}, "f.yaml", {})


def test_the_example_file_loads_given_its_variables() -> None:
    environ = {"VLLM_API_KEY": "vllm-dummy-key", "OPENAI_API_KEY": "sk-dummy-key"}
    config = load_config(ROOT / "examples" / "titan.yaml", environ)
    assert [m.name for m in config.models] == ["llama-3.1-8b", "gpt-4o-mini", "smollm2"]
    replicas = config.models[0].deployments
    assert [d.backend for d in replicas] == ["openai", "openai"]
    assert all(
        isinstance(d, OpenAIDeployment) and d.api_key.get_secret_value() == "vllm-dummy-key"
        for d in replicas
        if isinstance(d, OpenAIDeployment) and d.api_key is not None
    )
    assert config.models[0].fallbacks == ["gpt-4o-mini", "smollm2"]
    assert isinstance(config.models[2].deployments[0], EmbeddedDeployment)
    summary = describe(config)
    assert "vllm-dummy-key" not in summary and "sk-dummy-key" not in summary
