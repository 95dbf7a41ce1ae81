"""Admission inside the real pipeline (simulated deployments, memory storage): degradation steps,
streams settling their tokens, and the rule that an open bind needs keys."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.service.scripted import ScriptedBackend
from titan.config import config_from_mapping
from titan.errors import AuthenticationError, OverloadedError
from titan.protocol import ChatCompletionRequest, ClientRequest
from titan.service import Pipeline
from titan.storage import Storage
from titan.storage.memory import MemoryCounters, MemoryDocuments, MemoryLimits

FAST = {"backend": "simulated", "profile": {"ttft_s": 0.001}}


def memory() -> Storage:
    return Storage("memory://", MemoryDocuments(), MemoryCounters(), MemoryLimits())


def request(priority: str = "normal", *, stream: bool = False, **body) -> ClientRequest:
    data = {"model": "big", "messages": [{"role": "user", "content": "hi"}], **body}
    if stream:
        data["stream"] = True
    return ClientRequest(
        endpoint="chat",
        parsed=ChatCompletionRequest.model_validate(data),
        body=data,
        request_id="req-1",
        headers={"x-titan-priority": priority},
        client_host="127.0.0.1",
    )


@pytest.fixture
async def degraded() -> AsyncIterator[Pipeline]:
    """ "big" with its whole ladder applied (and kept: recovery would take a minute)."""
    steps = [
        {"action": "fallback_model", "model": "small", "priorities": ["normal", "batch"]},
        {"action": "cap_max_tokens", "max_tokens": 3, "priorities": ["normal", "batch"]},
        {"action": "cache_only", "reply": "Busy, try later.", "priorities": ["batch"]},
    ]
    config = config_from_mapping(
        {
            "models": [
                {
                    "name": "big",
                    "deployments": [FAST],
                    "degradation": {"queue_wait_p95_s": 1.0, "sustain_s": 60, "steps": steps},
                },
                {"name": "small", "deployments": [FAST]},
            ],
            "probes": {"enabled": False},
        },
        "test",
    )
    pipeline = Pipeline(config, storage=memory())
    await pipeline.start()
    pipeline.services.flow.gates.degradation.controllers["big"].level = 3  # type: ignore[union-attr]
    yield pipeline
    await pipeline.shutdown()


async def test_interactive_traffic_is_not_degraded(degraded: Pipeline):
    routed = await degraded.services.flow.complete(request("interactive", max_tokens=8))
    assert routed.model == "big"
    assert "x-titan-degraded" not in routed.headers
    assert routed.value.usage.completion_tokens == 8  # type: ignore[union-attr]


async def test_normal_traffic_goes_to_the_smaller_model_with_fewer_tokens(degraded: Pipeline):
    routed = await degraded.services.flow.complete(request("normal", max_tokens=8))
    assert routed.model == "small"
    assert routed.headers["x-titan-degraded"] == "fallback_model,cap_max_tokens"
    assert routed.value.usage.completion_tokens == 3  # type: ignore[union-attr]


async def test_batch_traffic_gets_the_configured_reply_as_an_answer_and_a_stream(
    degraded: Pipeline,
):
    routed = await degraded.services.flow.complete(request("batch"))
    assert routed.headers["x-titan-degraded"] == "cache_only"
    assert routed.value.choices[0].message.content == "Busy, try later."  # type: ignore[union-attr]
    streamed = await degraded.services.flow.stream(request("batch", stream=True))
    chunks = [chunk async for chunk in streamed.value]
    assert chunks[0].choices[0].delta.content == "Busy, try later."  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "stop"  # type: ignore[union-attr]


async def test_cache_only_without_a_reply_refuses_with_503():
    config = config_from_mapping(
        {
            "models": [
                {
                    "name": "big",
                    "deployments": [FAST],
                    "degradation": {
                        "queue_wait_p95_s": 1.0,
                        "sustain_s": 60,
                        "steps": [{"action": "cache_only"}],
                    },
                }
            ],
            "probes": {"enabled": False},
        },
        "test",
    )
    pipeline = Pipeline(config, storage=memory())
    await pipeline.start()
    try:
        pipeline.services.flow.gates.degradation.controllers["big"].level = 1  # type: ignore[union-attr]
        with pytest.raises(OverloadedError) as refused:
            await pipeline.services.flow.complete(request("normal"))
        assert refused.value.code == "degraded_cache_only"
    finally:
        await pipeline.shutdown()


async def test_a_stream_settles_its_token_reservation_when_it_ends():
    config = config_from_mapping(
        {
            "models": [{"name": "big", "deployments": [FAST], "limits": {"tpm": 1000}}],
            "probes": {"enabled": False},
        },
        "test",
    )
    pipeline = Pipeline(config, storage=memory())
    await pipeline.start()
    try:
        for _ in range(5):  # each reserves ~500 tokens and uses 16: without settling, 2 fit
            streamed = await pipeline.services.flow.stream(request(stream=True, max_tokens=500))
            assert [chunk async for chunk in streamed.value]
            assert streamed.headers["x-ratelimit-limit-tokens"] == "1000"
        snapshot = pipeline.stats()["big"]["admission"]["queue"]
        assert snapshot["running"] == 0
    finally:
        await pipeline.shutdown()


async def test_an_open_bind_without_keys_is_refused_unless_allowed():
    def config(**auth):  # type: ignore[no-untyped-def]
        return config_from_mapping(
            {
                "server": {"host": "0.0.0.0"},
                "models": [{"name": "big", "deployments": [FAST]}],
                "probes": {"enabled": False},
                "auth": auth,
            },
            "test",
        )

    closed = Pipeline(config(), storage=memory())
    with pytest.raises(AuthenticationError, match="without API keys"):
        await closed.start()
    await closed.shutdown()

    opened = Pipeline(config(allow_unauthenticated=True), storage=memory())
    await opened.start()
    await opened.shutdown()

    keyed = Pipeline(config(), storage=memory())
    await keyed.storage.documents.put("api_keys", "000000000000", {})  # type: ignore[union-attr]
    await keyed.start()  # a key exists: auth is on
    assert keyed.services.flow.gates.auth.is_auth_on  # type: ignore[union-attr]
    await keyed.shutdown()

    # A master key and no key yet (a fresh deployment): it starts, and lets nobody in but the
    # admin API, through which the first key is made.
    fresh = Pipeline(config(master_key="sk-master-0123456789abcdef"), storage=memory())
    await fresh.start()
    assert fresh.services.flow.gates.auth.is_auth_on  # type: ignore[union-attr]
    with pytest.raises(AuthenticationError, match="didn't provide an API key"):
        await fresh.services.flow.complete(request())
    await fresh.shutdown()


async def test_the_cache_field_is_titans_own_and_never_reaches_the_upstream():
    bodies: list[dict] = []

    class Capturing(ScriptedBackend):
        async def complete(self, request):  # type: ignore[no-untyped-def]
            bodies.append(dict(request.body))
            return await super().complete(request)

    config = config_from_mapping(
        {"models": [{"name": "big", "deployments": [FAST]}], "probes": {"enabled": False}},
        "test",
    )
    pipeline = Pipeline(
        config, storage=memory(), backend_factory=lambda d, *, model_name, name: Capturing(name)
    )
    await pipeline.start()
    try:
        routed = await pipeline.services.flow.complete(request(cache="no-store", temperature=0))
        assert routed.headers["x-titan-cache"] == "miss"
        assert bodies and "cache" not in bodies[0]
        assert bodies[0]["temperature"] == 0
    finally:
        await pipeline.shutdown()
