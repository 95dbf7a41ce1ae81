"""``${VAR}`` and ``${VAR:-default}`` references in config values, filled from the environment.

Only string values are substituted (never keys), and only once: a variable's value is not itself
searched for references. ``$${X}`` stands for the literal text ``${X}``. Values are never put in
messages: a missing variable is reported by its name and the key path that refers to it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from titan.config.keypath import KeyPath, render_path

# `$${...}` (an escape), or `${...}` (a reference); group "body" is what is inside the braces.
_REFERENCE = re.compile(r"\$(?P<escape>\$?)\{(?P<body>[^}]*)\}")
_BODY = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?$", re.DOTALL)


@dataclass
class Substituted:
    """The data with references filled in, where that happened, and what went wrong."""

    data: Any
    env_paths: set[KeyPath] = field(default_factory=set)  # values that came from the environment
    problems: list[str] = field(default_factory=list)  # "<key.path>: <what is wrong>"
    failed_paths: set[KeyPath] = field(default_factory=set)  # where a problem left a hole


def substitute_env(data: Any, environ: Mapping[str, str]) -> Substituted:
    """Fill every ``${VAR}`` in ``data``'s string values from ``environ``."""
    result = Substituted(data=None)
    result.data = _walk(data, (), environ, result)
    return result


def _walk(value: Any, path: KeyPath, environ: Mapping[str, str], result: Substituted) -> Any:
    if isinstance(value, Mapping):
        return {key: _walk(item, (*path, key), environ, result) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(item, (*path, i), environ, result) for i, item in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        return _substitute_string(value, path, environ, result)
    return value


def _substitute_string(
    text: str, path: KeyPath, environ: Mapping[str, str], result: Substituted
) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group("escape"):
            return match.group(0)[1:]
        body = _BODY.match(match.group("body"))
        if body is None:
            result.problems.append(
                f"{render_path(path)}: invalid reference {match.group(0)!r}: "
                "expected ${NAME} or ${NAME:-default}"
            )
            result.failed_paths.add(path)
            return ""
        result.env_paths.add(path)
        name, default = body.group("name"), body.group("default")
        value = environ.get(name)
        # As in the shell: the default also replaces a variable set to the empty string.
        if default is not None and not value:
            return default
        if value is None:
            result.problems.append(
                f"{render_path(path)}: environment variable {name!r} is not set "
                f"(write ${{{name}:-default}} to give it a default)"
            )
            result.failed_paths.add(path)
            return ""
        return value

    substituted = _REFERENCE.sub(replace, text)
    # A `${` left over has no closing brace.
    if "${" in _REFERENCE.sub("", text):
        result.problems.append(
            f"{render_path(path)}: unterminated reference: '${{' without a closing '}}'"
        )
        result.failed_paths.add(path)
    return substituted
