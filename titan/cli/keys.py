"""``titan keys``: create, list and revoke API keys in the configured storage.

Sync at this edge (``asyncio.run``); the storage is opened per command and closed after it.
The storage: ``--storage``, else ``$TITAN_STORAGE``, else the ``--config`` file's, else the
default, as for ``titan serve`` (``resolve_settings``); each command says which it used.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated, TypeVar

import orjson
import typer
from pydantic import ValidationError

from titan.cli.options import ConfigOption, StorageOption, say_store, storage_settings
from titan.config.admission import Budget
from titan.config.resolution import Resolved
from titan.config.summary import shown_url
from titan.errors import InvalidRequestError, TitanError
from titan.limits.keys import ApiKey, KeyPolicy, KeyRing, parse_key_id

T = TypeVar("T")

keys_app = typer.Typer(
    help="Create, list and revoke API keys.", no_args_is_help=True, add_completion=False
)

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")
# KeyPolicy and Budget fields -> the flags that set them, for validation messages.
_FLAGS = {"usd": "--budget-usd", "models": "--models", "expires_at": "--expires-in"}
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


class PriorityChoice(StrEnum):
    interactive = "interactive"
    normal = "normal"
    batch = "batch"


class BudgetPeriod(StrEnum):
    day = "day"
    month = "month"
    total = "total"


@keys_app.callback()
def _group() -> None:
    """Create, list and revoke API keys."""  # keeps the commands subcommands


def parse_duration(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` → seconds."""
    match = _DURATION.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise InvalidRequestError(
            f"invalid duration {text!r}: expected a positive number and a unit "
            "(s, m, h, d or w), e.g. '30d', '12h' or '90m'",
            param="expires_in",
        )
    return float(match.group(1)) * _DURATION_S[match.group(2)]


def _with_keyring(settings: Resolved, use: Callable[[KeyRing], Awaitable[T]]) -> T:
    async def run() -> T:
        # Imported here: a concrete store (and its driver) loads only when a command runs.
        from titan.storage.factory import open_storage

        config = settings.config
        storage = await open_storage(config.storage, data_at_rest=config.data_at_rest)
        try:
            return await use(KeyRing(storage.documents, cache_s=0))
        finally:
            await storage.close()

    return asyncio.run(run())


def _fail(command: str, exc: TitanError) -> typer.Exit:
    typer.echo(f"titan keys {command}: {exc.message}", err=True)
    return typer.Exit(2)


def _flag(loc: tuple[int | str, ...]) -> str:
    field = str(loc[-1]) if loc else ""
    return _FLAGS.get(field, f"--{field.replace('_', '-')}")


def _policy(
    *,
    models: str | None,
    rpm: int | None,
    tpm: int | None,
    max_concurrency: int | None,
    priority: PriorityChoice,
    expires_in: str | None,
    budget_usd: float | None,
    budget_period: BudgetPeriod | None,
) -> KeyPolicy:
    if budget_period is not None and budget_usd is None:
        raise InvalidRequestError("--budget-period needs --budget-usd")
    try:
        return KeyPolicy(
            models=tuple(m.strip() for m in (models or "").split(",") if m.strip()),
            rpm=rpm,
            tpm=tpm,
            max_concurrency=max_concurrency,
            priority=priority.value,
            expires_at=time.time() + parse_duration(expires_in) if expires_in else None,
            budget=None
            if budget_usd is None
            else Budget(usd=budget_usd, period=(budget_period or BudgetPeriod.month).value),
        )
    except ValidationError as exc:  # typer checks most flags; this names the rest
        problems = "; ".join(f"{_flag(err['loc'])}: {err['msg']}" for err in exc.errors())
        raise InvalidRequestError(f"invalid key policy: {problems}") from None


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the key belongs to.")],
    name: Annotated[str, typer.Option(help="A label for the key.")] = "",
    models: Annotated[
        str | None, typer.Option(help="Comma-separated models it may use (default: every one).")
    ] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option(min=1, help="Tokens per minute.")] = None,
    max_concurrency: Annotated[int | None, typer.Option(min=1, help="Requests at once.")] = None,
    priority: Annotated[
        PriorityChoice, typer.Option(help="Its requests' admission priority.")
    ] = PriorityChoice.normal,
    expires_in: Annotated[
        str | None, typer.Option(help="Lifetime, e.g. 30d, 12h or 90m (default: never).")
    ] = None,
    budget_usd: Annotated[
        float | None, typer.Option(help="Spending cap in USD per --budget-period.")
    ] = None,
    budget_period: Annotated[
        BudgetPeriod | None, typer.Option(help="The budget's period (default: month).")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='Print {"key", "tenant", "key_id", "store"} as JSON.'),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Print the key alone: export TITAN_API_KEY=$(titan keys create -q …)",
        ),
    ] = False,
    config_file: ConfigOption = None,
    storage: StorageOption = None,
) -> None:
    """Create a key and print it (once: only its hash is stored). The first key turns auth on
    for every server on the same storage."""
    try:
        policy = _policy(
            models=models,
            rpm=rpm,
            tpm=tpm,
            max_concurrency=max_concurrency,
            priority=priority,
            expires_in=expires_in,
            budget_usd=budget_usd,
            budget_period=budget_period,
        )
        settings = storage_settings(config_file, storage)
        key, record = _with_keyring(
            settings, lambda ring: ring.create(tenant, name=name, policy=policy)
        )
    except TitanError as exc:
        raise _fail("create", exc) from None
    say_store("titan keys create", settings)
    if as_json:
        payload = {
            "key": key,
            "tenant": record.tenant,
            "key_id": record.key_id,
            "store": shown_url(settings.config.storage),
        }
        typer.echo(orjson.dumps(payload).decode())
    elif quiet:
        typer.echo(key)
    else:
        typer.echo(f"Created key {record.key_id} for tenant {record.tenant}:\n\n  {key}\n")
    typer.echo("Store this key now: it will not be shown again.", err=True)


def _status(record: ApiKey, now: float) -> str:
    if record.is_revoked:
        return "revoked"
    return "expired" if record.is_expired(now) else "active"


def _when(timestamp: float | None) -> str:
    return "-" if timestamp is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(timestamp))


def _policy_text(policy: KeyPolicy) -> str:
    parts = [policy.priority] + [
        f"{label} {value}"
        for label, value in (
            ("rpm", policy.rpm),
            ("tpm", policy.tpm),
            ("conc", policy.max_concurrency),
        )
        if value is not None
    ]
    if policy.budget is not None:
        parts.append(f"${policy.budget.usd:g}/{policy.budget.period}")
    return ", ".join(parts)


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    config_file: ConfigOption = None,
    storage: StorageOption = None,
) -> None:
    """List keys (never their secrets or hashes), revoked and expired ones included."""
    try:
        settings = storage_settings(config_file, storage)
        records = _with_keyring(settings, lambda ring: ring.list(tenant))
    except TitanError as exc:
        raise _fail("list", exc) from None
    say_store("titan keys list", settings)
    if as_json:
        typer.echo(orjson.dumps([record.public() for record in records]).decode())
        return
    # Imported here so that other commands (and `titan --help`) stay quick.
    from rich import box
    from rich.console import Console
    from rich.table import Table

    now = time.time()
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, caption="Times in UTC.", caption_justify="left"
    )
    # The id shows whole at any width: it is what `revoke` takes. The rest folds.
    table.add_column("KEY ID", no_wrap=True, min_width=12)
    for header in ("TENANT", "NAME", "STATUS", "MODELS", "POLICY"):
        table.add_column(header, overflow="fold")
    table.add_column("EXPIRES", overflow="fold", min_width=10)  # created_at: in --json
    for record in records:
        table.add_row(
            record.key_id,
            record.tenant,
            record.name or "-",
            _status(record, now),
            ", ".join(record.policy.models) or "all",
            _policy_text(record.policy),
            _when(record.policy.expires_at),
        )
    Console().print(table if records else "No keys.")


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[
        str, typer.Argument(help="The key's id (see `titan keys list`), or the key itself.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help='Print {"key_id", "revoked", "store"} as JSON.')
    ] = False,
    config_file: ConfigOption = None,
    storage: StorageOption = None,
) -> None:
    """Revoke a key: it stops working within each server's key cache time (5 s by default)."""
    key_id = parse_key_id(key_id.strip()) or key_id  # a whole key names its id
    try:
        settings = storage_settings(config_file, storage)
        is_found = _with_keyring(settings, lambda ring: ring.revoke(key_id))
    except TitanError as exc:
        raise _fail("revoke", exc) from None
    say_store("titan keys revoke", settings)
    if as_json:
        payload = {
            "key_id": key_id,
            "revoked": is_found,
            "store": shown_url(settings.config.storage),
        }
        typer.echo(orjson.dumps(payload).decode())
    if not is_found:
        typer.echo(f"titan keys revoke: no key with id {key_id!r}", err=True)
        raise typer.Exit(1)
    if not as_json:
        typer.echo(f"Revoked key {key_id}.")
