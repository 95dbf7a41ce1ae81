"""One real Titan (uvicorn, the embedded SmolLM2-135M-Instruct) for every framework test, and
no framework telemetry: nothing here may leave the loopback interface."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.harness import running_titan

CONFIG = {
    "models": [{"deployments": [{"backend": "embedded", "engine": {"max_model_len": 2048}}]}],
    "probes": {"enabled": False},
    # Every request reaches the model: a framework's retry or second turn is never a cache hit.
    "cache": {"exact": False},
}
# LangSmith traces when these are set (LangChain reads them at call time), to the network.
_TELEMETRY_ENV = (
    "LANGSMITH_TRACING",
    "LANGSMITH_TRACING_V2",
    "LANGCHAIN_TRACING",
    "LANGCHAIN_TRACING_V2",
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGSMITH_ENDPOINT",
    "LANGCHAIN_ENDPOINT",
)


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _TELEMETRY_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def titan() -> Iterator[str]:
    with running_titan(CONFIG) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def base_url(titan: str) -> str:
    """What each framework is given as the OpenAI base URL."""
    return f"{titan}/v1"


@pytest.fixture(scope="session")
def model(titan: str) -> str:
    return httpx.get(f"{titan}/v1/models").json()["data"][0]["id"]
