"""Titan with an echoing fake model, served by a real uvicorn in a background thread."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.api.conftest import fake_pipeline
from tests.guardrails.echo import EchoEngine
from tests.integration.harness import running_titan
from titan.config import config_from_mapping


@contextmanager
def serving(engine: EchoEngine, config: dict[str, Any]) -> Iterator[str]:
    """The base URL of a ready Titan serving ``config`` (a mapping) on ``engine``."""
    titan_config = config_from_mapping(config, "test config")
    pipeline = fake_pipeline(engine, titan_config)  # type: ignore[arg-type]
    with running_titan(titan_config, pipeline=pipeline) as base_url:
        yield base_url
