"""Settings given on top of a config document: ``TITAN_<SECTION>__<KEY>`` environment variables
and command-line flags. Each override remembers who asked for it, so that a bad value is reported
against the flag or variable rather than against the file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from titan.config.gateway import TitanConfig
from titan.config.keypath import KeyPath
from titan.config.problems import suggestion

ENV_PREFIX = "TITAN_"
# The sections whose scalar settings environment variables may override.
ENV_SECTIONS = (
    "server", "client", "routing", "retry", "hedge", "breaker", "probes", "auth", "admission",
    "jobs", "observability", "context",
)  # fmt: skip
# Variables named for what they set rather than by section (taken as written, never as YAML):
# TITAN_STORAGE=redis://..., and the client commands' server and key.
ENV_ALIASES: dict[str, KeyPath] = {
    "TITAN_STORAGE": ("storage",),
    "TITAN_URL": ("client", "url"),
    "TITAN_API_KEY": ("client", "api_key"),
}


@dataclass(frozen=True)
class Override:
    path: KeyPath
    value: Any
    origin: str  # "--port", "environment variable TITAN_SERVER__PORT"


def env_overrides(environ: Mapping[str, str]) -> tuple[list[Override], list[str]]:
    """The overrides ``TITAN_<SECTION>__<KEY>`` variables ask for, and problems with them.

    Only names with a double underscore, and the ``ENV_ALIASES``, are overrides:
    ``TITAN_UPSTREAM_API_KEY`` is not (``titan serve --upstream`` reads it).
    Values are read as YAML scalars, so ``false``, ``9000`` and ``[429, 503]`` have their types.
    """
    overrides, problems = [], []
    for name in sorted(environ):
        origin = f"environment variable {name}"
        if name in ENV_ALIASES:
            overrides.append(Override(ENV_ALIASES[name], environ[name], origin))
            continue
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        if section not in ENV_SECTIONS:
            problems.append(
                f"{origin}: unknown section {section!r}{suggestion(section, ENV_SECTIONS)} "
                f"(environment overrides apply to {', '.join(ENV_SECTIONS)})"
            )
            continue
        allowed = list(TitanConfig.model_fields[section].annotation.model_fields)
        if key not in allowed:
            hint = suggestion(key, allowed) or f" (allowed keys: {', '.join(allowed)})"
            problems.append(f"{origin}: unknown key {key!r} in {section}{hint}")
            continue
        overrides.append(Override((section, key), _scalar(environ[name]), origin))
    return overrides, problems


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """A copy of ``data`` with each override set, creating the mappings on its path as needed.

    An override under a value that is not a mapping or list is skipped: validation then reports
    that value's type, which is the actual mistake.
    """
    result = _copy(data)
    for override in overrides:
        *parents, last = override.path
        node: Any = result
        for key in parents:
            if isinstance(node, dict):
                if node.get(key) is None:
                    node[key] = {}
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                node = None
                break
        is_list_slot = isinstance(node, list) and isinstance(last, int) and last < len(node)
        if isinstance(node, dict) or is_list_slot:
            node[last] = override.value
    return result


def origin_of(path: KeyPath, overrides: Sequence[Override]) -> Override | None:
    """The last override that set ``path`` or a mapping above it."""
    found = None
    for override in overrides:
        if path[: len(override.path)] == override.path:
            found = override
    return found


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(item) for item in value]
    return value
