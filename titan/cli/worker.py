"""``titan worker``: a process that runs queued jobs and batches, with no HTTP server.

It builds the same pipeline as ``titan serve`` from the same config (models, limits, cache) and
runs ``--concurrency`` jobs at once from the shared queue. Several workers (and replicas) share a
Redis or SQLite storage; SIGTERM hands the running jobs back to the queue before it exits.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer

from titan.config import TitanConfig, loading
from titan.errors import ConfigError, TitanError


def worker_config(
    config_file: Path | None, storage: str | None, concurrency: int | None, log_level: str | None
) -> TitanConfig:
    from titan.cli.main import build_config

    config = build_config(config_file=config_file, storage=storage, log_level=log_level)
    if config.storage.split("://", 1)[0] == "memory":
        raise ConfigError(
            "titan worker needs the storage the servers share (sqlite:///PATH or redis://HOST): "
            "a memory:// queue is this process's alone. Pass --storage or a --config with one."
        )
    workers = concurrency or config.jobs.workers or 16
    return loading.override_config(
        config, [loading.Override(("jobs", "workers"), workers, "--concurrency")]
    )


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
    config_file: Annotated[
        Path | None, typer.Option("--config", help="The titan.yaml the servers use.")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="The shared storage: redis://HOST:PORT/DB or sqlite:///PATH."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Jobs run at once (default: jobs.workers, else 16)."),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning, error.")] = None,
) -> None:
    """Run queued jobs and batches from the shared storage until SIGTERM or Ctrl-C."""
    from titan.observability import configure_logging

    try:
        config = worker_config(config_file, storage, concurrency, log_level)
        configure_logging(config.server.log_level)
        asyncio.run(run_worker(config))
    except TitanError as exc:
        typer.echo(f"titan worker: {exc.message}", err=True)
        raise typer.Exit(2) from None
