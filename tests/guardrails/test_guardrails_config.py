"""Guardrails configuration: clear errors for bad policies and hooks, nothing at all when no
policy is configured, and a failing hook refuses rather than lets content through."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.api.conftest import fake_pipeline, make_app
from tests.guardrails.echo import EchoEngine
from titan.api import create_app
from titan.backends.embedded import EmbeddedBackend
from titan.config import TitanConfig, config_from_mapping
from titan.config.summary import describe
from titan.errors import ConfigError
from titan.service import Pipeline
from titan.storage import Storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits
from titan.storage.memory_cache import MemoryCache


def guardrails(*policies: dict) -> dict:
    return {"guardrails": {"policies": list(policies)}}


@pytest.mark.parametrize(
    "policy, message",
    [
        ({"name": "p", "detect": ["email"], "bogus": 1}, "unknown key 'bogus'"),
        ({"name": "p", "patterns": ["("]}, "not a valid regex"),
        ({"name": "p", "patterns": ["a*"]}, "matches the empty string"),
        ({"name": "p"}, "checks nothing"),
        ({"name": "two words", "blocklist": ["x"]}, "policy name"),
        ({"name": "p", "detect": ["ssn"]}, "detect"),
        ({"name": "p", "blocklist": ["  "]}, "must not be blank"),
        ({"name": "p", "hook": "no_colon_here"}, "package.module:function"),
        ({"name": "p", "action": "drop", "blocklist": ["x"]}, "action"),
        ({"name": "p", "stages": [], "blocklist": ["x"]}, "stages"),
    ],
)
def test_bad_policies_are_refused_with_the_key(policy: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(guardrails(policy), "titan.yaml")
    assert message in str(caught.value) and "guardrails.policies" in str(caught.value)


def test_config_check_summarises_the_policies() -> None:
    policies = [
        {"name": "no-secrets", "stages": ["input"], "detect": ["secret"]},
        {"name": "pii", "action": "redact", "detect": ["email"]},
    ]
    config = config_from_mapping({"guardrails": {"policies": policies}}, "test")
    summary = describe(config).splitlines()
    assert "guardrails: no-secrets: block input; pii: redact input+output" in summary
    assert "guardrails: off" in describe(config_from_mapping({}, "test")).splitlines()


def test_policy_names_are_unique() -> None:
    with pytest.raises(ConfigError, match="repeated: p"):
        config_from_mapping(
            guardrails({"name": "p", "blocklist": ["x"]}, {"name": "p", "blocklist": ["y"]}), "f"
        )


@pytest.mark.parametrize(
    "hook, message",
    [
        ("tests.guardrails.no_such_module:check", "cannot import module"),
        ("tests.guardrails.hooks:missing", "has no attribute 'missing'"),
        ("tests.guardrails.hooks:NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_hook_that_does_not_exist_fails_at_startup(hook: str, message: str) -> None:
    config = config_from_mapping(guardrails({"name": "p", "hook": hook}), "titan.yaml")
    with pytest.raises(ConfigError) as caught:
        fake_pipeline(EchoEngine(), config)
    assert message in str(caught.value) and "guardrails.policies[0].hook" in str(caught.value)


async def test_no_policies_means_no_guardrail_step() -> None:
    app = make_app(EchoEngine(), TitanConfig())
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        pipeline = app.state.titan.pipeline
        assert not pipeline.guard.is_active
        assert pipeline.services.flow.guard is None  # the flow never calls into the guardrails


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = config_from_mapping(
        guardrails({"name": "moderation", "hook": "tests.guardrails.hooks:broken"}), "f"
    )
    app = make_app(EchoEngine(), config)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://titan.test") as client:
            yield client


async def test_a_failing_hook_refuses_the_request(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "guardrail_unavailable" and "moderation" in error["message"]
    assert "tests.guardrails" not in error["message"]  # the server's code stays private


async def test_cached_answers_pass_todays_output_policies() -> None:
    """An answer cached before a policy existed (a shared cache outlives a config change) is
    checked on its way out like a fresh one."""
    shared = Storage("memory://", MemoryDocuments(), MemoryCounters(), MemoryLimits(),
                     cache=MemoryCache())  # fmt: skip
    engine = EchoEngine()

    def factory(deployment, *, model_name, name):  # type: ignore[no-untyped-def]
        return EmbeddedBackend(
            deployment, model_name=model_name, name=name, engine_factory=engine.factory
        )

    body = {"model": "fake-model", "temperature": 0, "max_tokens": 80,
            "messages": [{"role": "user", "content": "write to dan@example.com"}]}  # fmt: skip
    policy = {"name": "pii", "action": "redact", "stages": ["output"], "detect": ["email"]}
    for config, cache, text in [
        (TitanConfig(), "miss", "write to dan@example.com"),
        (config_from_mapping(guardrails(policy), "f"), "hit-exact", "write to [REDACTED_EMAIL]"),
    ]:
        app = create_app(config, pipeline=Pipeline(config, backend_factory=factory, storage=shared))
        async with app.router.lifespan_context(app):
            await app.state.titan.start_task
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                response = await client.post("/v1/chat/completions", json=body)
                await (
                    app.state.titan.pipeline.services.flow.cache.close()
                )  # stored before the next app
                streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
        assert response.headers["x-titan-cache"] == cache
        assert response.json()["choices"][0]["message"]["content"] == text
        assert "dan@example.com" not in streamed.text or cache == "miss"
