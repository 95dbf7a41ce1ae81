"""Options several commands share, and how they turn into settings: always through
``resolve_settings`` (the defaults, ``--config``, ``TITAN_*`` variables, the flags), never by
reading a file or the environment themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from titan.config.admission import DEFAULT_STORAGE
from titan.config.overrides import Override
from titan.config.resolution import Resolved, resolve_settings
from titan.config.summary import shown_url

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A titan.yaml (or .json): the same file the servers use. Its settings come after "
        "the defaults and before TITAN_* variables and flags.",
    ),
]
StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Storage URL: sqlite:///PATH, redis://HOST:6379/0 or memory:// (else $TITAN_STORAGE, "
        f"else --config's storage, else {DEFAULT_STORAGE}).",
    ),
]
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="The Titan server (else $TITAN_URL, else --config's client.url, else "
        "http://<server.host>:<server.port> of the same settings: http://127.0.0.1:8000).",
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="The API key to send (else $TITAN_API_KEY, else --config's client.api_key).",
    ),
]


def storage_settings(config_file: Path | None, storage: str | None) -> Resolved:
    """The settings of a command that opens the storage itself (``--storage`` its flag)."""
    flags = [] if storage is None else [Override(("storage",), storage, "--storage")]
    return resolve_settings(config_file=config_file, flags=flags)


def client_settings(config_file: Path | None, url: str | None, api_key: str | None) -> Resolved:
    """The settings of a command that talks to a server over HTTP."""
    flags = [] if url is None else [Override(("client", "url"), url, "--url")]
    if api_key is not None:
        flags.append(Override(("client", "api_key"), api_key, "--api-key"))
    return resolve_settings(config_file=config_file, flags=flags)


def store_line(settings: Resolved) -> str:
    """``store: sqlite:////home/me/.local/share/titan/titan.db (default)``: which storage a
    command used and why, password masked."""
    return f"store: {shown_url(settings.config.storage)} ({settings.origin('storage')})"


def say_store(command: str, settings: Resolved) -> None:
    typer.echo(f"{command}: {store_line(settings)}", err=True)
