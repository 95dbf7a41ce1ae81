"""Bounded inputs (server.limits): each bound is a clear 4xx naming the parameter, never a 5xx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from tests.api.conftest import make_app
from tests.api.fakes import FakeEngine
from tests.api.test_errors import assert_openai_error
from titan.config import RequestLimits, ServerConfig, TitanConfig, config_from_mapping
from titan.errors import ConfigError

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def small() -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app with tight limits."""
    limits = RequestLimits(
        max_body_bytes=2048,
        body_timeout_s=0.05,
        max_json_depth=8,
        max_messages=3,
        max_message_chars=10,
        max_n=4,
        max_stop_sequences=2,
    )
    app = make_app(FakeEngine(), TitanConfig(server=ServerConfig(limits=limits)))
    async with app.router.lifespan_context(app):
        await app.state.titan.start_task
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 2, **fields}


# ---- sizes and counts ------------------------------------------------------------------------


async def test_body_over_the_limit_is_413_saying_the_limit(small: httpx.AsyncClient) -> None:
    response = await small.post("/v1/chat/completions", json=_chat(user="x" * 3000))
    error = assert_openai_error(response, 413)
    assert error["code"] == "body_too_large"
    assert "2048 bytes" in error["message"] and "server.limits.max_body_bytes" in error["message"]


async def test_body_without_content_length_is_counted_as_it_arrives(
    small: httpx.AsyncClient,
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 500

    response = await small.post("/v1/chat/completions", content=chunks())
    assert assert_openai_error(response, 413)["code"] == "body_too_large"


async def test_slow_body_is_408(small: httpx.AsyncClient) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"messages": '
        await asyncio.sleep(0.5)
        yield b"[]}"

    response = await small.post("/v1/chat/completions", content=trickle())
    error = assert_openai_error(response, 408)
    assert error["code"] == "request_timeout"
    assert "server.limits.body_timeout_s" in error["message"]
    assert response.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/v1/chat/completions", _chat(messages=USER * 4), "messages", "too_many_items"),
        (
            "/v1/chat/completions",
            _chat(messages=[*USER, {"role": "user", "content": "x" * 11}]),
            "messages[1].content",
            "string_too_long",
        ),
        (
            "/v1/chat/completions",  # text parts count together
            _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x" * 6}] * 2}]),
            "messages[0].content",
            "string_too_long",
        ),
        ("/v1/completions", {"prompt": "x" * 11}, "prompt", "string_too_long"),
        ("/v1/completions", {"prompt": ["a", "x" * 11]}, "prompt[1]", "string_too_long"),
        ("/v1/completions", {"prompt": ["a"] * 4}, "prompt", "too_many_items"),
        ("/v1/completions", {"prompt": "a", "best_of": 5}, "best_of", None),
        ("/v1/chat/completions", _chat(n=5), "n", None),
        ("/v1/chat/completions", _chat(stop=["a", "b", "c"]), "stop", "too_many_items"),
    ],
)
async def test_each_count_bound_is_a_400_naming_the_parameter(
    small: httpx.AsyncClient, path: str, body: dict[str, Any], param: str, code: str | None
) -> None:
    error = assert_openai_error(await small.post(path, json=body), 400, param)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert "server.limits." in error["message"]


async def test_requests_at_the_limits_pass(small: httpx.AsyncClient) -> None:
    body = _chat(messages=[{"role": "user", "content": "x" * 10}] * 3, n=4, stop=["a", "b"])
    assert (await small.post("/v1/chat/completions", json=body)).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"n": 17}, "n"), ({"n": 129}, "n"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")],
)
async def test_default_bounds(
    client: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    assert_openai_error(await client.post("/v1/chat/completions", json=_chat(**fields)), 400, param)


# ---- JSON shape and Unicode ------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_deep_json_is_400_naming_the_top_level_field(small: httpx.AsyncClient) -> None:
    body = '{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + _nested(9) + "}"
    response = await small.post("/v1/chat/completions", content=body)
    error = assert_openai_error(response, 400, "metadata")
    assert error["code"] == "json_too_deep"
    assert "8 levels" in error["message"] and "metadata" in error["message"]


async def test_nesting_past_orjsons_own_limit_is_400(client: httpx.AsyncClient) -> None:
    body = '{"messages": ' + _nested(5000) + "}"
    error = assert_openai_error(await client.post("/v1/chat/completions", content=body), 400)
    assert error["code"] == "invalid_json"


async def test_many_brackets_at_shallow_depth_pass(client: httpx.AsyncClient) -> None:
    body = _chat(vendor_field=[{"a": [{"b": []}]}] * 200)  # unknown fields are ignored
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


async def test_nul_in_text_is_refused(client: httpx.AsyncClient) -> None:
    body = _chat(messages=[{"role": "user", "content": "a\u0000b"}])
    error = assert_openai_error(
        await client.post("/v1/chat/completions", json=body), 400, "messages[0].content"
    )
    assert error["code"] == "invalid_characters"
    assert "NUL" in error["message"]


async def test_an_escaped_backslash_before_u0000_is_not_a_nul(client: httpx.AsyncClient) -> None:
    body = _chat(messages=[{"role": "user", "content": "C:\\u0000"}])
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


@pytest.mark.parametrize("text", ['"\\ud800"', '"\\udc00x"', '"a\\ud83d"'])
async def test_lone_surrogates_are_400(client: httpx.AsyncClient, text: str) -> None:
    body = '{"messages": [{"role": "user", "content": ' + text + "}]}"
    error = assert_openai_error(await client.post("/v1/chat/completions", content=body), 400)
    assert error["code"] == "invalid_json"


async def test_invalid_utf8_and_huge_numbers_are_400(client: httpx.AsyncClient) -> None:
    for body in (
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "n": 1e999}',
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 400 + b"}",
        b'{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}',
    ):
        response = await client.post("/v1/chat/completions", content=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"


# ---- config ----------------------------------------------------------------------------------


def test_limits_config_accepts_sizes_and_rejects_unknown_keys() -> None:
    config = config_from_mapping({"server": {"limits": {"max_body_bytes": "1MiB"}}}, "t.yaml")
    assert config.server.limits.max_body_bytes == 1024**2
    with pytest.raises(ConfigError, match="did you mean 'max_body_bytes'"):
        config_from_mapping({"server": {"limits": {"max_bodybytes": 1}}}, "t.yaml")


# ---- property: random bodies never give a 5xx ----------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()  # NaN and infinities come out as invalid JSON tokens: a 400
    | st.text(max_size=20)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | _json},
    optional={
        "content": st.text(max_size=30)
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}), max_size=2)
        | _json
    },
)
_sampling = {
    key: _json | st.integers(-5, 300)
    for key in ("n", "max_tokens", "temperature", "top_p", "stop", "seed", "logprobs", "best_of")
}
_sampling["top_logprobs"] = st.integers(-1, 25) | _json
_sampling["stream"] = st.booleans() | _json
_chat_bodies = st.fixed_dictionaries(
    {"messages": st.lists(_message, max_size=3) | _json}, optional=_sampling
)
_completion_bodies = st.fixed_dictionaries(
    {"prompt": st.text(max_size=30) | st.lists(st.integers(-1, 300), max_size=5) | _json},
    optional=_sampling,
)
# Mostly valid requests with odd text, so that bodies also reach the engine and back.
_plausible_chat = st.fixed_dictionaries(
    {
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=30)}
            ),
            min_size=1,
            max_size=3,
        )
    },
    optional={
        "n": st.integers(0, 20),
        "max_tokens": st.integers(0, 300),
        "stop": st.lists(st.text(max_size=3), max_size=20),
        "stream": st.booleans(),
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 22),
    },
)
_deep = st.integers(1, 1500).map(lambda depth: '{"messages": ' + _nested(depth) + "}")
_odd_strings = st.sampled_from(
    ["\\ud800", "\\udfff", "\\u0000", "\\uffff", "\\ud83d\\ude00", "\x7f"]
)
_odd_text = _odd_strings.map(
    lambda text: '{"messages": [{"role": "user", "content": "' + text + '"}]}'
)


def _encode(body: Any) -> bytes:
    # The standard library, not orjson: it writes integers past 64 bits, NaN and Infinity, so
    # that Titan's parser sees them.
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


def test_random_bodies_never_give_a_5xx() -> None:
    app: Starlette = make_app(FakeEngine())
    with asyncio.Runner() as runner:
        lifespan = app.router.lifespan_context(app)
        runner.run(lifespan.__aenter__())
        runner.run(asyncio.wait_for(app.state.titan.start_task, 10))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

        @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(
            request=st.tuples(st.just("/v1/chat/completions"), _plausible_chat)
            | st.tuples(
                st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
                _chat_bodies | _completion_bodies | _deep | _odd_text | _json,
            )
        )
        def check(request: tuple[str, Any]) -> None:
            path, body = request
            response = runner.run(client.post(path, content=_encode(body)))
            assert response.status_code < 500, (body, response.text)
            if response.status_code != 200:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        try:
            check()
        finally:
            runner.run(client.aclose())
            runner.run(lifespan.__aexit__(None, None, None))
