"""Finding and reading scenarios: a YAML file, or the name of one shipped with Titan
(``titan/chaos/scenarios/NAME.yaml``). Every problem becomes one ConfigError line naming
the file and the key."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from titan.chaos.scenario import Scenario
from titan.chaos.titan_config import check_titan_config
from titan.config.keypath import render_path
from titan.config.problems import validation_problems
from titan.errors import ConfigError
from titan.loadgen import workload_by_name

SHIPPED_PACKAGE = "titan.chaos"
SHIPPED_FOLDER = "scenarios"


@dataclass(frozen=True)
class LoadedScenario:
    scenario: Scenario
    source: str  # the file, as given or found


def shipped_scenarios() -> dict[str, Path]:
    """Shipped scenario names -> their files, sorted by name."""
    folder = importlib.resources.files(SHIPPED_PACKAGE) / SHIPPED_FOLDER
    paths = [Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".yaml")]
    return {path.stem: path for path in sorted(paths)}


def resolve(name_or_path: str) -> Path:
    """A path to an existing file, or a shipped scenario's name. Raises ConfigError."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = shipped_scenarios()
    stem = name_or_path.removesuffix(".yaml")
    if stem in shipped and not path.parent.parts:
        return shipped[stem]
    names = ", ".join(shipped)
    raise ConfigError(
        f"{name_or_path}: no such file, and no shipped scenario of that name ({names})"
    )


def load_scenario(name_or_path: str) -> LoadedScenario:
    path = resolve(name_or_path)
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError(f"{where}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML ({type(exc).__name__})") from None
    scenario = scenario_from_mapping(data, source)
    check_titan_config(scenario, source)
    load = scenario.load
    try:  # an unknown workload or a bad jsonl file: said now, not after everything started
        workload_by_name(load.workload, seed=load.seed, max_tokens=load.max_tokens)
    except ConfigError as exc:
        raise ConfigError(f"{source}: load.workload: {exc.message}") from None
    return LoadedScenario(scenario, source)


def scenario_from_mapping(data: object, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a scenario is a mapping of keys (name, duration_s, ...)")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{render_path(p.path)}: {p.message}" if p.path else p.message
            for p in validation_problems(exc, Scenario, set())
        ]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None
