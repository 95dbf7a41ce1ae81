"""``titan storage reseal``: finish a data-key rotation (see docs/data-at-rest.md).

Sync at this edge (``asyncio.run``). The keys and the storage are resolved as for every command
(``resolve_settings``): the defaults, ``--config``, ``TITAN_*`` variables, ``--storage``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from titan.cli.options import ConfigOption, StorageOption, say_store, storage_settings
from titan.config.summary import shown_url
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
    config_file: ConfigOption = None,
    storage: StorageOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Print {"store", "resealed", "current", "by_namespace"} as JSON.'
        ),
    ] = False,
) -> None:
    """Rewrite every document not sealed with the current (first) data key."""
    try:
        settings = storage_settings(config_file, storage)
        config = settings.config
        report = asyncio.run(_reseal(config.storage, config.data_at_rest.key_bytes()))
    except TitanError as exc:
        typer.echo(f"titan storage reseal: {exc.message}", err=True)
        raise typer.Exit(2) from None
    say_store("titan storage reseal", settings)
    if as_json:
        payload = {
            "store": shown_url(config.storage),
            "resealed": report.num_resealed,
            "current": report.num_current,
            "by_namespace": report.by_namespace,
        }
        typer.echo(orjson.dumps(payload).decode())
        return
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
