"""``titan chaos``'s usage side, through its own typer app: listing, and one-line refusals (exit 2)
for bad scenarios and options. Running scenarios: tests/e2e/test_chaos_scenarios.py."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from titan.cli.chaos import chaos


def invoke(*args: str):
    app = typer.Typer(add_completion=False)
    app.command()(chaos)
    return CliRunner().invoke(app, list(args))


def test_list_shows_the_shipped_scenarios():
    result = invoke("--list")
    assert result.exit_code == 0
    for name in ("periodic-p99-spikes", "429-storm", "slow-stream", "throughput-plateau"):
        assert name in result.output


def test_a_missing_scenario_is_a_usage_error():
    result = invoke()
    assert result.exit_code == 2 and "give a SCENARIO" in result.output


def test_an_unknown_name_is_one_line(tmp_path):
    result = invoke("no-such-scenario", "--output", str(tmp_path))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "no shipped scenario of that name" in lines[0]
    assert "Traceback" not in result.output


def test_a_bad_scenario_names_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nduration_s: 5\nbackends: []\nload: {model: m, rate: 1}\nfautls: []\n")
    result = invoke(str(path), "--output", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert f"{path}: fautls: unknown key 'fautls'" in result.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_a_bad_time_scale_is_refused():
    assert invoke("429-storm", "--time-scale", "0").exit_code == 2
