"""/health, /ready, /v1/models and the app's lifespan (background model load, clean shutdown)."""

from __future__ import annotations

import asyncio

import httpx

from tests.api.conftest import fake_pipeline, make_app
from tests.api.fakes import FakeEngine
from titan.api import create_app
from titan.config import EmbeddedDeployment, EmbeddedModelConfig, ModelConfig, TitanConfig
from titan.errors import ModelLoadError

USER = [{"role": "user", "content": "hi"}]


def client_for(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")  # type: ignore[arg-type]


async def test_health_at_once_ready_after_the_model_loaded() -> None:
    engine = FakeEngine(start_gate=asyncio.Event())
    app = make_app(engine)
    async with app.router.lifespan_context(app), client_for(app) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        loading = await client.get("/ready")
        assert loading.status_code == 503 and loading.json() == {"status": "loading"}
        chat = await client.post("/v1/chat/completions", json={"messages": USER})
        assert chat.status_code == 503
        assert chat.json()["error"]["type"] == "service_unavailable"
        assert (await client.get("/v1/models")).json() == {"object": "list", "data": []}
        assert (await client.get("/stats")).json() == {"models": {}}

        assert engine.start_gate is not None
        engine.start_gate.set()
        await app.state.titan.start_task
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        stats = (await client.get("/stats")).json()["models"]["fake-model"]
        deployment = stats["deployments"]["embedded-0"]
        assert deployment["state"] == "closed" and deployment["outstanding"] == 0
        engine_stats = deployment["backend"]
        assert engine_stats["num_running"] == 0 and engine_stats["num_active_streams"] == 0
        assert "kv_cache_usage" in engine_stats
        assert (await client.get("/health")).status_code == 200
    assert engine.is_shut_down  # the lifespan's exit shut the engine down


async def test_failed_load_is_reported_and_hook_called() -> None:
    engine = FakeEngine(start_error=ModelLoadError("no such model file: /x.gguf"))
    failures: list[BaseException] = []
    config = TitanConfig()
    app = create_app(
        config, pipeline=fake_pipeline(engine, config), on_start_failure=failures.append
    )
    async with app.router.lifespan_context(app), client_for(app) as client:
        await app.state.titan.start_task
        response = await client.get("/ready")
        assert response.status_code == 503
        assert response.json() == {"status": "failed", "error": "no such model file: /x.gguf"}
        assert (await client.get("/health")).status_code == 200
    assert len(failures) == 1 and isinstance(failures[0], ModelLoadError)


async def test_engine_config_comes_from_titan_config() -> None:
    engine = FakeEngine()
    embedded = EmbeddedModelConfig(
        served_model_name="smol", max_model_len=128, kv_cache_bytes="64MiB", max_num_seqs=4
    )
    config = TitanConfig(models=[ModelConfig(deployments=[EmbeddedDeployment(engine=embedded)])])
    app = make_app(engine, config)
    async with app.router.lifespan_context(app), client_for(app) as client:
        await app.state.titan.start_task
        assert engine.config is not None
        assert engine.config.served_model_name == "smol"
        assert engine.config.kv_cache_bytes == 64 * 1024**2
        assert engine.config.max_num_seqs == 4
        assert engine.config.max_num_batched_tokens == 512  # unset: the engine's default
        models = (await client.get("/v1/models")).json()
        assert [card["id"] for card in models["data"]] == ["smol"]
        assert models["data"][0]["max_model_len"] == 128


async def test_models(client: httpx.AsyncClient) -> None:
    listing = (await client.get("/v1/models")).json()
    assert listing["object"] == "list"
    (card,) = listing["data"]
    assert card["id"] == "fake-model" and card["object"] == "model"
    assert card["owned_by"] == "titan" and isinstance(card["created"], int)
    retrieved = await client.get("/v1/models/fake-model")
    assert retrieved.status_code == 200 and retrieved.json() == card


async def test_model_ids_with_slashes(engine: FakeEngine) -> None:
    engine.model_name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    app = make_app(engine)
    async with app.router.lifespan_context(app), client_for(app) as client:
        await app.state.titan.start_task
        response = await client.get("/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct")
        assert response.status_code == 200
        assert response.json()["id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


async def test_requests_after_shutdown_are_503(engine: FakeEngine) -> None:
    app = make_app(engine)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
    async with client_for(app) as client:
        response = await client.post("/v1/chat/completions", json={"messages": USER})
        assert response.status_code == 503
        assert (await client.get("/ready")).status_code == 503
