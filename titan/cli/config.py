"""``titan config check``: check a config before serving with it, and see where each setting
comes from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from titan.config import loading
from titan.config.resolution import resolve_settings
from titan.errors import ConfigError

config_app = typer.Typer(
    help="Validate and explain Titan config files.", no_args_is_help=True, add_completion=False
)


@config_app.callback()
def _group() -> None:
    """Validate and explain Titan config files."""  # keeps `check` a subcommand


@config_app.command("check")
def check(
    file: Annotated[
        Path | None,
        typer.Argument(help="A titan.yaml (or .json) config file (none: the defaults)."),
    ] = None,
) -> None:
    """Validate FILE with the TITAN_* variables of the environment, as every command reads them
    (the defaults, the file, the variables; a command's flags come last), and print what it
    configures and where each setting not at its default comes from; exit 1 listing every
    problem when it is invalid."""
    try:
        settings = resolve_settings(config_file=file)
    except ConfigError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(1) from None
    typer.echo(loading.describe(settings.config))
    rows = settings.explained()
    if rows:
        typer.echo("not at their defaults:")
        width = max(len(f"{key} = {value}") for key, value, _ in rows)
        for key, value, origin in rows:
            typer.echo(f"  {f'{key} = {value}':<{width}}  from {origin}")
    else:
        typer.echo("not at their defaults: nothing (no file, no TITAN_* variables)")
    typer.echo("OK")
