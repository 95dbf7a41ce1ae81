"""One Titan per test module, on an echoing fake model, with the module's ``CONFIG``."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.guardrails.echo import EchoEngine
from tests.guardrails.server import serving


@pytest.fixture(scope="module")
def engine() -> EchoEngine:
    return EchoEngine()


@pytest.fixture(scope="module")
def base_url(request: pytest.FixtureRequest, engine: EchoEngine) -> Iterator[str]:
    with serving(engine, request.module.CONFIG) as url:
        yield url


@pytest.fixture(scope="module")
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client
