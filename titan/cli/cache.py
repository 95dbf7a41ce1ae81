"""``titan cache prepare-verifier``: the semantic cache's pair verifier weights, trained now.

``titan serve`` trains them itself at its first start with semantic caching on (in the
background; no semantic hit until they are ready). This makes them ahead of time: on the
machine that will serve (they land in the cache folder the server looks in), or anywhere, to
copy to servers and name in ``cache.semantic.pair_verifier_weights`` (an image build step).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

cache_app = typer.Typer(
    help="The response cache's models.", no_args_is_help=True, add_completion=False
)


@cache_app.callback()
def _group() -> None:
    """The response cache's models."""  # keeps the commands subcommands


@cache_app.command("prepare-verifier")
def prepare_verifier_command(
    folder: Annotated[
        Path | None,
        typer.Option(
            "--folder",
            help="Where to keep the weights (default: the cache folder titan serve reads, "
            "~/.cache/titan/pair-verifier).",
        ),
    ] = None,
) -> None:
    """Train the pair verifier's weights unless the folder holds them (~10 min on 2 cores)."""
    from titan.cache.embedder import model_dir
    from titan.cache.pair_training import default_weights_dir, trained_weights
    from titan.errors import ModelLoadError

    started = time.monotonic()
    say = lambda line: typer.echo(line, err=True)  # noqa: E731
    try:
        path = trained_weights(folder or default_weights_dir(), model_dir(), say=say)
    except ModelLoadError as exc:
        typer.echo(f"titan cache prepare-verifier: {exc.message}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{path}  ({time.monotonic() - started:.0f} s)", err=True)
    typer.echo(str(path))
