"""Every error is an OpenAI-shaped body with the right status; bad input never gives a 500."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from tests.api.conftest import make_app
from tests.api.fakes import FakeEngine
from titan.api.errors import CatchAllMiddleware, error_response, exception_handlers
from titan.errors import (
    EngineError,
    ModelLoadError,
    RateLimitError,
    ServiceUnavailableError,
)

USER = [{"role": "user", "content": "hi"}]


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": []}, "messages", ["at least 1 item", "got 0"]),
        ({}, "messages", ["Missing required parameter"]),
        ({"messages": USER, "temperature": "hot"}, "temperature", ["valid number", '"hot"']),
        ({"messages": USER, "temperature": 5}, "temperature", ["between 0 and 2", "5"]),
        ({"messages": USER, "top_p": 0}, "top_p", ["top_p"]),
        ({"messages": USER, "n": 0}, "n", ["greater than or equal to 1", "got 0"]),
        ({"messages": USER, "logprobs": True, "top_logprobs": 30}, "top_logprobs", ["20"]),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs", ["'logprobs' must be true"]),
        ({"messages": USER, "max_tokens": 0}, "max_tokens", ["greater than or equal to 1"]),
        ({"messages": USER, "min_tokens": 50, "max_tokens": 5}, "min_tokens", ["max_tokens"]),
        ({"messages": USER, "stop": 3}, "stop", ["string or an array of strings"]),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", ["'user'"]),
        ({"messages": [{"role": "user"}]}, "messages[0]", ["'content' is required"]),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages[0].content",
            ["input_audio", "only 'text'"],
        ),
        ({"messages": USER, "tools": "get_weather"}, "tools", ["valid list"]),
        ({"messages": USER, "tools": ["get_weather"]}, "tools[0]", ["valid dictionary"]),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function", ["function"]),
        (
            {"messages": USER, "tools": [{"type": "function", "function": {"description": "x"}}]},
            "tools[0].function.name",
            ["'name'"],
        ),
        (
            {"messages": USER, "tools": [{"function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools[0].function.parameters",
            ["not a valid JSON Schema"],
        ),
        (
            {"messages": USER, "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            ["only allowed when 'tools'"],
        ),
        (
            {"messages": USER, "response_format": {"type": "json_schema"}},
            "response_format",
            ["json_schema", "needs 'json_schema.schema'"],
        ),
        ({"messages": USER, "logit_bias": {"1": 5}}, "logit_bias", ["not supported"]),
        # Free text is never quoted back (it may be a prompt): its length is.
        (
            {"messages": USER, "temperature": "my secret prompt text"},
            "temperature",
            ["a string of 21 characters"],
        ),
    ],
)
async def test_bad_chat_parameters_are_400_naming_the_param(
    client: httpx.AsyncClient, body: dict[str, Any], param: str, words: list[str]
) -> None:
    response = await client.post("/v1/chat/completions", json=body)
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error["message"]
    assert "secret prompt" not in error["message"]


async def test_tools_with_tool_choice_none_are_accepted(client: httpx.AsyncClient) -> None:
    body = {
        "messages": USER,
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "tool_choice": "none",
        "max_tokens": 1,
    }
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3, "stream": True}, "best_of"),  # best_of > n streamed
        ({"prompt": "x", "best_of": 2, "n": 3}, "best_of"),  # best_of < n
        ({"prompt": "x", "use_beam_search": True, "temperature": 0.5}, "temperature"),
        ({"prompt": "x", "use_beam_search": True, "stream": True}, "stream"),
        ({"prompt": "x", "use_beam_search": True, "logprobs": 1}, "logprobs"),
        ({"prompt": "x", "use_beam_search": True, "n": 11}, "n"),
        ({"prompt": "x", "use_beam_search": True, "n": 2, "best_of": 1}, "best_of"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": [[1], "a"]}, "prompt"),
        ({"prompt": [300]}, "prompt"),  # beyond the vocabulary
    ],
)
async def test_bad_completion_parameters(
    client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    assert_openai_error(await client.post("/v1/completions", json=body), 400, param)


async def test_prompt_without_tokens_is_400(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.tokenizer.encode = lambda text, add_special_tokens=False: []  # type: ignore[method-assign]
    response = await client.post("/v1/completions", json={"prompt": ""})
    assert "empty" in assert_openai_error(response, 400, "prompt")["message"]


async def test_best_of_equal_to_n_is_fine(client: httpx.AsyncClient) -> None:
    body = {"prompt": "x", "best_of": 2, "n": 2, "max_tokens": 1}
    assert (await client.post("/v1/completions", json=body)).status_code == 200


@pytest.mark.parametrize(
    "raw", [b"{", b"", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"messages": [}', b"null"]
)
async def test_malformed_json_is_400(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert assert_openai_error(response, 400)["code"] == "invalid_json"


async def test_unknown_model_is_404_listing_models(client: httpx.AsyncClient) -> None:
    for path, body in [
        ("/v1/chat/completions", {"model": "gpt-9", "messages": USER}),
        ("/v1/completions", {"model": "gpt-9", "prompt": "x"}),
    ]:
        error = assert_openai_error(await client.post(path, json=body), 404, "model")
        assert error["code"] == "model_not_found" and "fake-model" in error["message"]
    error = assert_openai_error(await client.get("/v1/models/gpt-9"), 404, "model")
    assert error["code"] == "model_not_found"


async def test_prompt_too_long_states_both_counts(client: httpx.AsyncClient) -> None:
    long_text = "x" * 300
    response = await client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": long_text}]}
    )
    error = assert_openai_error(response, 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert "256 tokens" in error["message"] and "318 tokens" in error["message"]
    response = await client.post("/v1/completions", json={"prompt": "x" * 250, "max_tokens": 10})
    error = assert_openai_error(response, 400, "prompt")
    assert "256" in error["message"] and "251 in the prompt" in error["message"]
    assert "10 in the completion" in error["message"]


async def test_errors_before_the_stream_are_plain_json(client: httpx.AsyncClient) -> None:
    body = {"messages": USER, "stream": True, "max_tokens": 1000}
    response = await client.post("/v1/chat/completions", json=body)
    assert assert_openai_error(response, 400, "messages")["code"] == "context_length_exceeded"
    body = {"prompt": "x", "stream": True, "temperature": 9}
    assert_openai_error(await client.post("/v1/completions", json=body), 400, "temperature")


async def test_error_after_the_stream_started_is_an_sse_event(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.fail_after_tokens = 2
    body = {"messages": USER, "stream": True, "max_tokens": 10}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    events = response.text.strip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    assert events[-2].startswith('data: {"error":')
    assert '"code":"engine_error"' in events[-2]
    assert events[-3].startswith('data: {"id":')


async def test_engine_failure_without_stream_is_500(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.fail_after_tokens = 1
    response = await client.post("/v1/chat/completions", json={"messages": USER})
    assert assert_openai_error(response, 500)["code"] == "engine_error"


async def test_unexpected_exception_is_500_without_details(engine: FakeEngine) -> None:
    def broken_generate(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    engine.generate = broken_generate  # type: ignore[method-assign]
    app = make_app(engine)
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post("/v1/chat/completions", json={"messages": USER})
            error = assert_openai_error(response, 500)
            assert "secret" not in response.text and error["type"] == "server_error"
            stream = await client.post(
                "/v1/chat/completions", json={"messages": USER, "stream": True}
            )
            assert_openai_error(stream, 500)


async def test_unknown_route_and_wrong_method(client: httpx.AsyncClient) -> None:
    assert assert_openai_error(await client.get("/v2/nothing"), 404)["code"] == "not_found"
    response = await client.get("/v1/chat/completions")
    assert assert_openai_error(response, 405)["code"] == "method_not_allowed"
    assert response.headers["allow"] == "POST"
    assert_openai_error(await client.delete("/v1/models"), 405)


async def test_error_response_mapping() -> None:
    limited = error_response(RateLimitError("slow down", retry_after=2.2))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    assert error_response(ServiceUnavailableError("loading")).status_code == 503
    assert error_response(EngineError("boom")).status_code == 500
    assert error_response(ModelLoadError("bad file")).status_code == 500


async def test_handlers_work_on_any_starlette_app() -> None:
    async def limited(request: Request) -> Any:
        raise RateLimitError("too many", retry_after=5)

    app = Starlette(
        routes=[Route("/x", limited)],
        exception_handlers=exception_handlers(),
        middleware=[],
    )
    app.add_middleware(CatchAllMiddleware)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/x")
    assert_openai_error(response, 429)
    assert response.headers["retry-after"] == "5"


async def test_body_too_large_is_413(client: httpx.AsyncClient) -> None:
    huge = b'{"prompt": "' + b"x" * (33 * 1024**2) + b'"}'
    response = await client.post("/v1/completions", content=huge)
    assert_openai_error(response, 413)
