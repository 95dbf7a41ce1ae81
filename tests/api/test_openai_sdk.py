"""The official openai SDK as the client, over an in-process transport (fast; the e2e test
does the same against a real server and the real model)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from starlette.applications import Starlette

from tests.api.fakes import REPLY, FakeEngine

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def sdk(app: Starlette) -> AsyncIterator[openai.AsyncOpenAI]:
    http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    async with openai.AsyncOpenAI(
        base_url="http://titan.test/v1", api_key="unused", http_client=http_client, max_retries=0
    ) as client:
        yield client


async def test_chat(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model="fake-model", messages=USER, max_tokens=4, logprobs=True, top_logprobs=1
    )
    assert completion.choices[0].message.content == REPLY[:4]
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].logprobs is not None
    assert completion.usage is not None and completion.usage.completion_tokens == 4


async def test_chat_stream_with_usage(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="fake-model",
        messages=USER,
        max_completion_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
        usage = chunk.usage or usage
    assert text == REPLY[:5]
    assert usage is not None and usage.completion_tokens == 5


async def test_completions(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.completions.create(
        model="fake-model", prompt=["a", "b"], max_tokens=2, echo=True
    )
    assert [choice.text for choice in completion.choices] == ["a" + REPLY[:2], "b" + REPLY[:2]]
    stream = await sdk.completions.create(model="fake-model", prompt="a", max_tokens=3, stream=True)
    assert "".join([chunk.choices[0].text async for chunk in stream]) == REPLY[:3]


async def test_models(sdk: openai.AsyncOpenAI) -> None:
    assert [model.id async for model in sdk.models.list()] == ["fake-model"]
    assert (await sdk.models.retrieve("fake-model")).id == "fake-model"


async def test_errors(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await sdk.chat.completions.create(model="nope", messages=USER)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.chat.completions.create(model="fake-model", messages=USER, temperature=5)
    assert bad.value.param == "temperature"


async def test_stream_error_event_raises(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    engine.fail_after_tokens = 1
    stream = await sdk.chat.completions.create(
        model="fake-model", messages=USER, max_tokens=5, stream=True
    )
    with pytest.raises(openai.APIError, match="failed on purpose"):
        async for _ in stream:
            pass
