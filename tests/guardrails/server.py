"""Titan with an echoing fake model, served by a real uvicorn in a background thread."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai

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


def cache_status(sdk: openai.OpenAI, model: str, text: str, max_tokens: int) -> str:
    """The ``x-titan-cache`` header of a greedy chat request for ``text``."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0,
    )  # fmt: skip
    return raw.headers["x-titan-cache"]
