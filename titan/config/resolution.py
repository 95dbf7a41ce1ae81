"""Every command's settings, one way: the defaults, then the ``--config`` file, then ``TITAN_*``
environment variables, then the command's own flags (later wins).

``resolve_settings`` is how each command in ``titan.cli`` gets its settings (a guard test holds
them to it), so that ``titan serve``, ``titan keys``, ``titan worker`` and the rest agree on the
storage, the server and the keys whatever way the user gave them. ``Resolved.origins`` says
where each setting that is not a default came from: ``titan config check`` prints it, and the
commands that write to storage say which store they used.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from titan.config import gateway
from titan.config.gateway import TitanConfig
from titan.config.keypath import KeyPath, render_path
from titan.config.loading import layered_config, read_config_file
from titan.config.overrides import Override
from titan.config.problems import secret_field_names
from titan.config.summary import SECRET_MASK, shown_url
from titan.errors import ConfigError

DEFAULTS = "default"
# `titan serve --upstream URL`'s key when --api-key is not given: unlike a flag, other users
# cannot read it in the process list.
UPSTREAM_API_KEY_ENV = "TITAN_UPSTREAM_API_KEY"
_MAX_SHOWN_CHARS = 72


@dataclass(frozen=True)
class Resolved:
    """The effective config, and where each setting that is not a default came from."""

    config: TitanConfig
    # The key path of each setting (a leaf of the file, or what a variable or flag set) -> its
    # origin: the file's path, "environment variable TITAN_STORAGE", "--storage".
    origins: Mapping[KeyPath, str]

    def origin(self, *path: str | int) -> str:
        """Where the setting at ``path`` came from: the layer that set it or a mapping above
        it, else the file if it set anything below it, else ``"default"``."""
        found = [origin for key, origin in self.origins.items() if path[: len(key)] == key]
        if found:
            return found[-1]
        below = [origin for key, origin in self.origins.items() if key[: len(path)] == path]
        return below[0] if below else DEFAULTS

    def explained(self) -> list[tuple[str, str, str]]:
        """``(key, value, origin)`` for each setting not at its default, in the config's order,
        secrets shown as ``***``."""
        dumped = self.config.model_dump(mode="json")
        secrets = secret_field_names(TitanConfig)
        rows = []
        for path, origin in self.origins.items():
            is_secret = any(isinstance(key, str) and key in secrets for key in path)
            value = _at(dumped, path)
            shown = SECRET_MASK if is_secret and value is not None else _shown(value)
            if path == ("storage",):
                shown = shown_url(str(value))
            rows.append((render_path(path), shown, origin))
        return rows


def resolve_settings(
    *,
    config_file: Path | None = None,
    document: tuple[Any, str] | None = None,
    flags: Sequence[Override] = (),
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """The settings of one command run: the defaults, then ``config_file`` (or ``document``,
    a ``(mapping, source name)`` standing in for one), then the ``TITAN_*`` variables of
    ``environ`` (default: this process's), then ``flags``. Raises ConfigError naming the file,
    variable or flag of each problem."""
    if config_file is not None and document is not None:
        raise ConfigError("a config file and a config document cannot be combined")
    if config_file is not None:
        data, source = read_config_file(config_file), str(config_file)
    elif document is not None:
        data, source = document
    else:
        data, source = None, DEFAULTS
    layers = layered_config(data, source, os.environ if environ is None else environ, flags)
    origins = {path: source for path in _leaf_paths(layers.document, ()) if path}
    for override in layers.overrides:
        width = len(override.path)
        origins = {path: o for path, o in origins.items() if path[:width] != override.path}
        origins[override.path] = override.origin
    return Resolved(layers.config, origins)


def upstream_flag(
    base_url: str,
    model: str | None,
    api_key: str | None,
    environ: Mapping[str, str] | None = None,
) -> Override:
    """``titan serve --upstream URL [--model NAME] [--api-key KEY]``: NAME (or every model the
    upstream lists) served by URL, with KEY or else ``$TITAN_UPSTREAM_API_KEY``."""
    environ = os.environ if environ is None else environ
    key = api_key if api_key is not None else environ.get(UPSTREAM_API_KEY_ENV)
    deployment: dict[str, Any] = {"backend": "openai", "base_url": base_url}
    if key:
        deployment["api_key"] = key
    name = model if model is not None else gateway.ALL_UPSTREAM_MODELS
    return Override(("models",), [{"name": name, "deployments": [deployment]}], "--upstream")


def _leaf_paths(value: Any, path: KeyPath) -> Iterator[KeyPath]:
    """The settings a document sets: each scalar, list of scalars or empty container."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _leaf_paths(item, (*path, key))
    elif isinstance(value, list) and any(isinstance(item, Mapping | list) for item in value):
        for index, item in enumerate(value):
            yield from _leaf_paths(item, (*path, index))
    else:
        yield path


def _at(data: Any, path: KeyPath) -> Any:
    for key in path:
        is_item = isinstance(data, list) and isinstance(key, int) and key < len(data)
        if is_item or (isinstance(data, Mapping) and key in data):
            data = data[key]
        else:
            return None
    return data


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 1] + "…"
