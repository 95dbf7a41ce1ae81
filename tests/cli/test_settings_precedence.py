"""Every command, for each setting it uses: the default, then the ``--config`` file, then the
``TITAN_*`` variable, then the flag, later winning (titan/config/resolution.py).

Each case runs the real command (typer's runner) with the four layers stacked one at a time and
catches the value where the command uses it (the storage it opens, the URL and key it sends, the
config it serves), so a command that read a setting any other way would show it here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from titan import observability
from titan.cli import bench_url, jobs, main, storage, worker
from titan.config.admission import DEFAULT_STORAGE
from titan.config.summary import shown_url
from titan.storage import factory


class Caught(Exception):
    """Raised where a command uses a setting, after noting the value."""


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]  # without --config and the flag
    file: dict[str, Any]  # the config file's document, which sets the setting
    variable: tuple[str, str]  # (TITAN_* name, value)
    flag: tuple[str, str]  # (flag, value)
    default: Any
    # (the value the file, variable and flag each stand for) -> what the command sees
    seen: Callable[[str], Any] = lambda value: value


def storage_case(name: str, argv: list[str]) -> Case:
    return Case(
        name,
        argv,
        file={"storage": "sqlite:///from-file.db"},
        variable=("TITAN_STORAGE", "sqlite:///from-variable.db"),
        flag=("--storage", "sqlite:///from-flag.db"),
        default=shown_url(DEFAULT_STORAGE),
    )


CASES = [
    storage_case("keys create", ["keys", "create", "--tenant", "acme"]),
    storage_case("keys list", ["keys", "list"]),
    storage_case("keys revoke", ["keys", "revoke", "0123456789ab"]),
    storage_case("storage reseal", ["storage", "reseal"]),
    storage_case("worker storage", ["worker"]),
    storage_case("serve storage", ["serve"]),
    Case(
        "serve port",
        ["serve"],
        file={"server": {"port": 8101}},
        variable=("TITAN_SERVER__PORT", "8102"),
        flag=("--port", "8103"),
        default=8000,
        seen=int,
    ),
    Case(
        "worker log level",
        ["worker", "--storage", "sqlite:///w.db"],
        file={"server": {"log_level": "error"}},
        variable=("TITAN_SERVER__LOG_LEVEL", "warning"),
        flag=("--log-level", "debug"),
        default="info",
    ),
    Case(
        "jobs url",
        ["jobs", "list"],
        file={"client": {"url": "http://from-file:1"}},
        variable=("TITAN_URL", "http://from-variable:2"),
        flag=("--url", "http://from-flag:3"),
        default="http://127.0.0.1:8000",
    ),
    Case(
        "jobs api key",
        ["jobs", "status", "job_1"],
        file={"client": {"api_key": "key-from-file"}},
        variable=("TITAN_API_KEY", "key-from-variable"),
        flag=("--api-key", "key-from-flag"),
        default=None,
    ),
    Case(
        "bench URL api key",
        ["bench", "http://127.0.0.1:9/v1"],
        file={"client": {"api_key": "key-from-file"}},
        variable=("TITAN_API_KEY", "key-from-variable"),
        flag=("--api-key", "key-from-flag"),
        default=None,
    ),
]


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Where each command uses its settings: the value is noted, the command stops there."""
    values: list[Any] = []

    def note(value: Any) -> Any:
        values.append(value)
        raise Caught

    async def open_storage(url: str, **_: Any) -> Any:
        note(shown_url(url))

    async def reseal(url: str, keys: list[bytes]) -> Any:
        note(shown_url(url))

    class Client:
        def __init__(self, base_url: str, headers: dict[str, str], **_: Any):
            bearer = headers.get("Authorization")
            values.append({"url": base_url, "key": bearer and bearer.removeprefix("Bearer ")})
            raise httpx.ConnectError("caught")

    def run_server(settings: Any) -> int:
        config = settings.config
        note({"storage": shown_url(config.storage), "port": config.server.port})
        return 0

    async def run_worker(config: Any) -> None:
        note({"storage": shown_url(config.storage), "log_level": config.server.log_level})

    def discover_model(url: str, key: str | None) -> str:
        note({"key": key})
        return ""

    monkeypatch.setattr(factory, "open_storage", open_storage)
    monkeypatch.setattr(storage, "_reseal", reseal)
    monkeypatch.setattr(jobs.httpx, "Client", Client)
    monkeypatch.setattr(main, "run_server", run_server)
    monkeypatch.setattr(worker, "run_worker", run_worker)
    monkeypatch.setattr(bench_url, "discover_model", discover_model)
    monkeypatch.setattr(observability, "configure_logging", lambda level: None)
    return values


def the_value(case: Case, seen: Any) -> Any:
    if isinstance(seen, dict):
        key = {"serve port": "port", "worker log level": "log_level", "jobs url": "url"}.get(
            case.name, "key" if "api key" in case.name else "storage"
        )
        return seen[key]
    return seen


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_defaults_then_file_then_variable_then_flag(case: Case, caught: list[Any], tmp_path: Path):
    file = tmp_path / "titan.yaml"
    file.write_text(yaml.safe_dump(case.file))
    no_variables = {"TITAN_STORAGE": None, "TITAN_URL": None, "TITAN_API_KEY": None}
    variable = {**no_variables, case.variable[0]: case.variable[1]}
    layers = [
        ("default", [], no_variables, case.default),
        ("file", ["--config", str(file)], no_variables, _value_of(case.file)),
        ("variable", ["--config", str(file)], variable, case.variable[1]),
        ("flag", ["--config", str(file), *case.flag], variable, case.flag[1]),
    ]
    for layer, extra, env, expected in layers:
        caught.clear()
        CliRunner().invoke(main.build_cli(), [*case.argv, *extra], env=env)
        assert caught, f"{case.name}: the command never used the setting ({layer})"
        value = the_value(case, caught[0])
        assert value == (None if expected is None else case.seen(expected)), (layer, caught[0])


def _value_of(document: dict[str, Any]) -> Any:
    (value,) = document.values()
    return next(iter(value.values())) if isinstance(value, dict) else value


def test_config_check_says_where_each_setting_came_from(tmp_path: Path):
    file = tmp_path / "titan.yaml"
    file.write_text(yaml.safe_dump({"server": {"port": 8101}, "storage": "memory://"}))
    env = {"TITAN_STORAGE": "redis://:hunter2@cache:6379/0", "TITAN_HEDGE__ENABLED": "false"}
    result = CliRunner().invoke(main.build_cli(), ["config", "check", str(file)], env=env)
    assert result.exit_code == 0, result.output
    lines = {line.split("=")[0].strip(): line for line in result.stdout.splitlines() if "=" in line}
    assert lines["server.port"].endswith(f"from {file}")
    assert lines["storage"].endswith("from environment variable TITAN_STORAGE")
    assert "redis://:***@cache:6379/0" in lines["storage"] and "hunter2" not in result.output
    assert lines["hedge.enabled"].endswith("from environment variable TITAN_HEDGE__ENABLED")
    assert "server.host" not in lines  # at its default: not listed


def test_chaos_checks_a_scenarios_titan_config_with_the_environments_variables(tmp_path: Path):
    from titan.chaos.scenario_files import load_scenario

    model = {"name": "m", "deployments": [{"upstream": "a"}]}
    document = {
        "name": "s",
        "duration_s": 1,
        "backends": [{"name": "a", "simulated": {}}],
        "titan": {"config": {"models": [model]}},
        "load": {"rate": 1, "model": "m"},
        "faults": [],
    }
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(document))
    load_scenario(str(scenario))  # valid as written
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TITAN_ADMISSION__MAX_QUEUE", "-1")
        with pytest.raises(Exception, match="environment variable TITAN_ADMISSION__MAX_QUEUE"):
            load_scenario(str(scenario))
