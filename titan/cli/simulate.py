"""``titan simulate``: a simulated OpenAI-compatible upstream that follows a profile file."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from titan.config import SimulationProfile
from titan.errors import ConfigError

# Stalled streams must not hold a restart back for long: it is a test upstream.
GRACEFUL_SHUTDOWN_S = 2


def _describe(error: Any) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "the profile"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    return f"invalid value for '{key}': {error['msg']}"


def load_profile(path: Path) -> SimulationProfile:
    """A profile YAML file, validated. Raises ConfigError naming the file and the bad key."""
    import yaml  # here: `titan --help` need not load it

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the profile: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}  # an empty file: the default profile
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a profile is a mapping of keys to values")
    try:
        return SimulationProfile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors(include_url=False))
        raise ConfigError(f"{path}: {problems}") from None


class _QuietResets(logging.Filter):
    """Simulated resets leave responses unfinished on purpose; uvicorn logs each as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing response" not in record.getMessage()


def simulate(
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    profile: Annotated[
        Path | None,
        typer.Option(help="A profile YAML file (default: 20 ms to the answer, no faults)."),
    ] = None,
    model: Annotated[
        str, typer.Option(help="The model name it lists and answers as.")
    ] = "simulated",
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1, help="Answers at once; more wait their turn, as at an engine's batch limit."
        ),
    ] = None,
    allow_fault_control: Annotated[
        bool,
        typer.Option(
            help="Serve POST /simulation/faults (chaos runs inject faults through it). Anyone "
            "who reaches the port can then break this backend: for tests only."
        ),
    ] = False,
) -> None:
    """Serve a simulated OpenAI-compatible upstream: latency, spikes, errors, stalls, outages."""
    try:
        loaded = load_profile(profile) if profile is not None else SimulationProfile()
    except ConfigError as exc:
        typer.echo(f"titan simulate: {exc.message}", err=True)
        raise typer.Exit(2) from None

    # Imported here so that `titan --help` stays quick.
    import uvicorn

    from titan.simulate.server import create_simulator_app

    config = uvicorn.Config(
        create_simulator_app(
            loaded, model, max_concurrency=max_concurrency, allow_fault_control=allow_fault_control
        ),
        host=host,
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        workers=1,
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    logging.getLogger("uvicorn.error").addFilter(_QuietResets())
    uvicorn.Server(config).run()
