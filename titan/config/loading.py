"""Config files (YAML or JSON) → a validated ``TitanConfig``, or one ConfigError listing every
problem as ``<file>: <key.path>: <what is wrong>``.

The order, later winning: the file (or the defaults), then ``TITAN_<SECTION>__<KEY>``
environment variables, then command-line flags (``layered_config``; commands go through
``titan.config.resolution.resolve_settings``). ``${VAR}`` references in
the file are filled from the environment first. The environment is read only when a function
here is called, never at import.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import ValidationError

from titan.config.gateway import TitanConfig
from titan.config.keypath import KeyPath, render_path
from titan.config.overrides import Override, apply_overrides, env_overrides, origin_of
from titan.config.problems import Problem, secret_field_names, validation_problems
from titan.config.substitution import substitute_env
from titan.config.summary import SECRET_MASK, describe
from titan.errors import ConfigError

__all__ = [
    "Layers",
    "Override",
    "config_from_mapping",
    "describe",
    "layered_config",
    "load_config",
    "read_config_file",
]

# Shorter strings are not masked in messages: masking "a" would garble every word, and a
# credential that short protects nothing anyway.
_MIN_MASKED_LENGTH = 4


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> TitanConfig:
    """Read, fill in and validate a config file; ``environ`` defaults to ``os.environ``."""
    return config_from_mapping(read_config_file(path), str(path), environ)


def read_config_file(path: Path) -> Any:
    """The file's document: JSON for ``.json`` files (or text starting with ``{``), else YAML."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if _is_json(path, text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        # Only the problem and its position: the error's own text quotes the file's lines,
        # which may hold secrets.
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({type(exc).__name__})") from None


def config_from_mapping(
    data: Any, source: str, environ: Mapping[str, str] | None = None
) -> TitanConfig:
    """Validate a config document (None: all defaults); ``source`` names it in messages."""
    return layered_config(data, source, environ).config


@dataclass(frozen=True)
class Layers:
    """A validated config and what it was made of, for saying where each setting came from."""

    config: TitanConfig
    document: Any  # the file's document, its ${VAR} references filled in ({} without a file)
    overrides: list[Override]  # the environment's, then the flags', in the order applied


def layered_config(
    data: Any,
    source: str,
    environ: Mapping[str, str] | None = None,
    flags: Sequence[Override] = (),
) -> Layers:
    """The defaults, then the document ``data`` (None: none), then ``TITAN_*`` variables of
    ``environ`` (default ``os.environ``), then ``flags``; validated once, each problem named
    after the layer that caused it."""
    environ = os.environ if environ is None else environ
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of settings, got a {type(data).__name__}")
    substituted = substitute_env(data, environ)
    problems = [f"{source}: {problem}" for problem in substituted.problems]
    problems += [f"{source}: {problem}" for problem in _non_string_keys(data, ())]
    overrides, override_problems = env_overrides(environ)
    problems += override_problems
    overrides += flags
    merged = apply_overrides(_with_defaults_under(substituted.data, overrides), overrides)
    # Validation goes on past those problems, so that one run lists them all; where a variable
    # was missing, the validation error is only a consequence and is left out.
    config = _validate(
        merged,
        source,
        overrides,
        hidden_paths=substituted.env_paths,
        known_problems=problems,
        skipped_paths=substituted.failed_paths,
    )
    return Layers(config, substituted.data, overrides)


def _validate(
    data: dict[str, Any],
    source: str,
    overrides: Sequence[Override],
    hidden_paths: set[KeyPath],
    known_problems: Sequence[str] = (),
    skipped_paths: Collection[KeyPath] = (),
) -> TitanConfig:
    lines = list(known_problems)
    try:
        config = TitanConfig.model_validate(data)
    except ValidationError as exc:
        lines += [
            _line(problem.path, problem.message, source, overrides)
            for problem in validation_problems(exc, TitanConfig, hidden_paths)
            if not _is_consequence(problem, skipped_paths)
        ]
        if not lines:  # each consequence's cause is in known_problems; never pass silently
            lines.append(f"{source}: invalid configuration")
    except ConfigError as exc:  # raised by a validator that does not go through pydantic
        lines.append(f"{source}: {exc.message}")
    else:
        if not lines:
            return config
    raise ConfigError(_masked("\n".join(lines), _secret_strings(data)))


def _with_defaults_under(data: Mapping[str, Any], overrides: Sequence[Override]) -> Any:
    """``data`` with the default value of each top-level setting that an override reaches into
    by index (``models[0]...`` with no ``models`` in the file): the item must exist to be set."""
    missing = {
        override.path[0]
        for override in overrides
        if override.path[0] not in data and any(isinstance(key, int) for key in override.path)
    }
    if not missing:
        return data
    defaults = TitanConfig().model_dump()
    return {**data, **{key: defaults[key] for key in missing}}


def _is_consequence(problem: Problem, skipped_paths: Collection[KeyPath]) -> bool:
    """Caused by a problem already reported: a value left empty by a missing variable (an
    unknown key there is still news), or a key that is not a string (reported as written)."""
    if problem.is_invalid_key:
        return True
    return problem.path in skipped_paths and not problem.is_unknown_key


def _line(path: KeyPath, message: str, source: str, overrides: Sequence[Override]) -> str:
    override = origin_of(path, overrides)
    if override is not None:
        inner = path[len(override.path) :]
        return f"{override.origin}: {render_path(inner) + ': ' if inner else ''}{message}"
    return f"{source}: {render_path(path)}: {message}" if path else f"{source}: {message}"


def _non_string_keys(value: Any, path: KeyPath) -> list[str]:
    """YAML turns unquoted ``on``/``yes``/``1`` keys into booleans and numbers; say so early,
    before pydantic reports them with the boolean already turned into a number."""
    problems = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(
                    f"{render_path(path)}: key {key!r} is not a string; quote it (YAML reads "
                    "unquoted on, off, yes and no as true or false)"
                )
            problems += _non_string_keys(item, (*path, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            problems += _non_string_keys(item, (*path, index))
    return problems


def _secret_strings(data: Any) -> set[str]:
    """Every string under a secret key (``api_key``, ``headers``...) anywhere in ``data``."""
    secret_keys = secret_field_names(TitanConfig)
    found: set[str] = set()

    def walk(value: Any, is_secret: bool) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, is_secret or key in secret_keys)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item, is_secret)
        elif is_secret and isinstance(value, str) and len(value) >= _MIN_MASKED_LENGTH:
            found.add(value)

    walk(data, False)
    return found


def _masked(text: str, secrets: set[str]) -> str:
    # Longest first, so that a secret containing another is masked whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, SECRET_MASK)
    return text


def _is_json(path: Path, text: str) -> bool:
    if path.suffix.lower() == ".json":
        return True
    if path.suffix.lower() in (".yaml", ".yml"):
        return False
    return text.lstrip().startswith("{")
