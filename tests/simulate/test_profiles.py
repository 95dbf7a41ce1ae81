"""Profile files: the examples load, and a bad file is refused with its name and the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from titan.cli.simulate import load_profile, simulate
from titan.config import SimulationProfile
from titan.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "profiles"


@pytest.mark.parametrize(
    "name", ["steady", "spiky", "flaky", "outage", "stalls", "model-server", "model-server-half"]
)
def test_example_profiles_load_and_say_what_they_model(name: str):
    path = EXAMPLES / f"{name}.yaml"
    assert path.read_text().startswith(f"# {name}: ")
    assert isinstance(load_profile(path), SimulationProfile)


def test_examples_model_what_their_names_say():
    assert load_profile(EXAMPLES / "spiky.yaml").spike_multiplier == 20
    flaky = load_profile(EXAMPLES / "flaky.yaml")
    assert (flaky.error_probability, flaky.error_status) == (0.03, 503)
    (outage,) = load_profile(EXAMPLES / "outage.yaml").outages
    assert outage.duration_s == 10 and outage.status is None
    full = load_profile(EXAMPLES / "model-server.yaml").server
    half = load_profile(EXAMPLES / "model-server-half.yaml").server
    assert full is not None and half is not None
    assert half.kv_cache_tokens * 2 == full.kv_cache_tokens
    assert half.step_cost.fixed_s == 2 * full.step_cost.fixed_s
    assert half.step_cost.per_token_s == 2 * full.step_cost.per_token_s
    assert load_profile(EXAMPLES / "steady.yaml").server is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_s: 0.1\nttft: 2\n", "unknown key 'ttft'"),
        (
            "outages:\n  - start_s: 1\n    duration_s: 0\n",
            "invalid value for 'outages.0.duration_s'",
        ),
        ("spike_probability: 2\n", "invalid value for 'spike_probability'"),
        ("- a list\n", "a profile is a mapping"),
        ("ttft_s: [1\n", "not valid YAML"),
        ("server:\n  kv_cache: 10\n", "unknown key 'server.kv_cache'"),
    ],
)
def test_a_bad_profile_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert str(path) in caught.value.message and expected in caught.value.message


def test_an_empty_file_is_the_default_profile(tmp_path: Path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_profile(path) == SimulationProfile()


def test_a_missing_file_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_profile(tmp_path / "missing.yaml")


def test_the_command_refuses_a_bad_profile_with_exit_code_2(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("spike_probabilty: 0.1\n")
    cli = typer.Typer()
    cli.command()(simulate)
    result = CliRunner().invoke(cli, ["--profile", str(path)])
    assert result.exit_code == 2
    assert f"titan simulate: {path}: unknown key 'spike_probabilty'" in result.output
