"""``titan config``: check a config file before serving with it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from titan.config import loading
from titan.errors import ConfigError

config_app = typer.Typer(
    help="Validate and explain Titan config files.", no_args_is_help=True, add_completion=False
)


@config_app.callback()
def _group() -> None:
    """Validate and explain Titan config files."""  # keeps `check` a subcommand


@config_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="A titan.yaml (or .json) config file.")],
) -> None:
    """Validate FILE (with ${VAR} references and TITAN_* overrides from the environment) and
    print what it configures; exit 1 listing every problem when it is invalid."""
    try:
        config = loading.load_config(file)
    except ConfigError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(1) from None
    typer.echo(loading.describe(config))
    typer.echo("OK")
