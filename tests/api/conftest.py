from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from tests.api.fakes import FakeEngine
from titan.api import create_app
from titan.backends.embedded import EmbeddedBackend
from titan.config import TitanConfig
from titan.service import Pipeline
from titan.storage import Storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits


def fake_pipeline(engine: FakeEngine, config: TitanConfig) -> Pipeline:
    """The real pipeline, with every embedded deployment served by ``engine``."""

    def factory(deployment, *, model_name, name):  # type: ignore[no-untyped-def]
        return EmbeddedBackend(
            deployment, model_name=model_name, name=name, engine_factory=engine.factory
        )

    memory = Storage("memory://", MemoryDocuments(), MemoryCounters(), MemoryLimits())
    return Pipeline(config, backend_factory=factory, storage=memory)


def make_app(engine: FakeEngine, config: TitanConfig | None = None) -> Starlette:
    config = config or TitanConfig()
    return create_app(config, pipeline=fake_pipeline(engine, config))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def app(engine: FakeEngine) -> AsyncIterator[Starlette]:
    """The app with its lifespan running and the (fake) model loaded."""
    app = make_app(engine)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        yield app


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://titan.test") as client:
        yield client
