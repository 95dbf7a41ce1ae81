"""``titan worker``: a process that runs queued jobs and batches, with no HTTP server.

It builds the same pipeline as ``titan serve`` from the same config (models, limits, cache) and
runs ``--concurrency`` jobs at once from the shared queue. Several workers (and replicas) share a
Redis or SQLite storage; SIGTERM hands the running jobs back to the queue before it exits.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from titan.cli.options import ConfigOption, StorageOption, store_line
from titan.config import TitanConfig
from titan.config.overrides import Override
from titan.config.resolution import Resolved, resolve_settings
from titan.errors import ConfigError, TitanError

DEFAULT_CONCURRENCY = 16


def worker_settings(
    config_file: Path | None, storage: str | None, concurrency: int | None, log_level: str | None
) -> Resolved:
    """``resolve_settings`` with the worker's flags; ``jobs.workers`` is its concurrency:
    ``--concurrency``, else the settings' own (when not 0, which leaves jobs to workers), else 16.
    """
    flags = [] if storage is None else [Override(("storage",), storage, "--storage")]
    if log_level is not None:
        flags.append(Override(("server", "log_level"), log_level.lower(), "--log-level"))
    settings = resolve_settings(config_file=config_file, flags=flags)
    if settings.config.storage.split("://", 1)[0] == "memory":
        raise ConfigError(
            "titan worker needs the storage the servers share (sqlite:///PATH or redis://HOST): "
            "a memory:// queue is this process's alone. Pass --storage or a --config with one."
        )
    workers = concurrency or settings.config.jobs.workers or DEFAULT_CONCURRENCY
    flags.append(Override(("jobs", "workers"), workers, "--concurrency"))
    return resolve_settings(config_file=config_file, flags=flags)


async def run_worker(config: TitanConfig) -> None:
    from titan.service import build_pipeline

    pipeline = build_pipeline(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await pipeline.start()  # starts the worker: config.jobs.workers > 0
        await stop.wait()
    finally:
        await pipeline.shutdown()


def worker(
    config_file: ConfigOption = None,
    storage: StorageOption = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Jobs run at once (default: jobs.workers, else 16)."),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning, error.")] = None,
) -> None:
    """Run queued jobs and batches from the shared storage until SIGTERM or Ctrl-C."""
    from titan.observability import configure_logging

    try:
        settings = worker_settings(config_file, storage, concurrency, log_level)
        configure_logging(settings.config.server.log_level)
        logging.getLogger("titan.settings").info(
            "titan worker: %s, %d jobs at once", store_line(settings), settings.config.jobs.workers
        )
        asyncio.run(run_worker(settings.config))
    except TitanError as exc:
        typer.echo(f"titan worker: {exc.message}", err=True)
        raise typer.Exit(2) from None
