"""``titan storage reseal``: finish a data-key rotation (see docs/data-at-rest.md).

Sync at this edge (``asyncio.run``). The keys and the storage come from ``--config`` (and the
``TITAN_*`` environment, as for ``titan serve``); ``--storage`` overrides the URL.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from titan.errors import TitanError

if TYPE_CHECKING:
    from titan.storage.sealed_reseal import ResealReport

storage_app = typer.Typer(
    help="Maintain the stored data (encryption at rest).", no_args_is_help=True,
    add_completion=False,
)  # fmt: skip


@storage_app.callback()
def _group() -> None:
    """Maintain the stored data (encryption at rest)."""  # keeps the commands subcommands


@storage_app.command("reseal")
def reseal_command(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="The titan.yaml with storage and data_at_rest keys."),
    ] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Storage URL; overrides --config.")
    ] = None,
) -> None:
    """Rewrite every document not sealed with the current (first) data key."""
    from titan.cli.main import build_config

    try:
        config = build_config(config_file=config_file, storage=storage)
        report = asyncio.run(_reseal(config.storage, config.data_at_rest.key_bytes()))
    except TitanError as exc:
        typer.echo(f"titan storage reseal: {exc.message}", err=True)
        raise typer.Exit(2) from None
    for namespace, count in sorted(report.by_namespace.items()):
        typer.echo(f"  {namespace}: {count}")
    typer.echo(
        f"resealed {report.num_resealed} document(s); {report.num_current} already current. "
        "Cached answers and job payloads are not rewritten: keep the old key until they expire."
    )


async def _reseal(url: str, keys: list[bytes]) -> ResealReport:
    # Imported here: a concrete store (and its driver) loads only when the command runs.
    from titan.storage.factory import open_storage
    from titan.storage.sealed import Keyring, SealedDocuments
    from titan.storage.sealed_reseal import reseal

    opened = await open_storage(url)
    try:
        return await reseal(SealedDocuments(opened.documents, Keyring(keys)))
    finally:
        await opened.close()
