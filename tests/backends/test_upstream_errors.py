"""Upstream statuses, error bodies and headers mapped to UpstreamError."""

# Error bodies as the servers send them, one per line.
# ruff: noqa: E501

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from titan.backends.upstream_errors import (
    MAX_MESSAGE_CHARS,
    error_from_response,
    error_from_stream_event,
    parse_error_body,
    parse_retry_after,
)

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()

BODIES = {
    "openai": (
        b'{"error":{"message":"Invalid value","type":"invalid_request_error","param":"n","code":"bad_n"}}',
        ("Invalid value", "invalid_request_error", "n", "bad_n"),
    ),
    "vllm": (
        b'{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}',
        ("too long", "BadRequestError", None, None),
    ),
    "vllm-old-and-sglang": (
        b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}',
        ("too long", "BadRequestError", None, None),
    ),
    "tgi": (
        b'{"error":"Input validation error: `inputs` must have less than 4096 tokens","error_type":"validation"}',
        (
            "Input validation error: `inputs` must have less than 4096 tokens",
            "validation",
            None,
            None,
        ),
    ),
    "ollama-native": (
        b'{"error":"model \\"x\\" not found"}',
        ('model "x" not found', None, None, None),
    ),
    "ollama-v1": (
        b'{"error":{"message":"model \\"x\\" not found","type":"not_found_error","param":null,"code":null}}\n',
        ('model "x" not found', "not_found_error", None, None),
    ),
    "llama.cpp": (
        b'{"error":{"code":400,"message":"tools param requires --jinja flag","type":"invalid_request_error"}}',
        ("tools param requires --jinja flag", "invalid_request_error", None, None),
    ),
    "fastapi": (b'{"detail":"Not Found"}', ("Not Found", None, None, None)),
    "fastapi-validation": (
        b'{"detail":[{"loc":["body","messages"],"msg":"Field required","type":"missing"}]}',
        ("Field required", None, None, None),
    ),
    "text": (b"  Bad Gateway\n", ("Bad Gateway", None, None, None)),
}


@pytest.mark.parametrize("body,expected", BODIES.values(), ids=BODIES.keys())
def test_every_error_dialect(body: bytes, expected: tuple):
    details = parse_error_body(body)
    assert (details.message, details.error_type, details.param, details.code) == expected


def test_long_bodies_are_truncated():
    message = parse_error_body(b"<html>" + b"x" * 10_000).message
    assert len(message) == MAX_MESSAGE_CHARS and message.endswith("…")


@pytest.mark.parametrize(
    "status,is_retryable",
    [(status, False) for status in (400, 401, 404, 422)]
    + [(status, True) for status in (408, 409, 429, 500, 502, 503, 504)],
)
def test_retryable_statuses(status: int, is_retryable: bool):
    error = error_from_response(status, b"", {})
    assert (error.status_code, error.is_retryable) == (status, is_retryable)


def test_client_errors_keep_the_upstreams_words():
    error = error_from_response(400, BODIES["openai"][0], {})
    assert error.to_body() == {
        "error": {
            "message": "Invalid value",
            "type": "invalid_request_error",
            "param": "n",
            "code": "bad_n",
        }
    }
    assert error_from_response(401, b"", {}).error_type == "authentication_error"
    assert error_from_response(422, b"", {}).message == "HTTP 422 from the upstream"


def test_server_errors_are_titans_upstream_errors():
    error = error_from_response(
        503, b'{"error":"Model is overloaded","error_type":"overloaded"}', {}
    )
    assert error.message == "Upstream HTTP 503: Model is overloaded"
    assert (error.error_type, error.param) == ("upstream_error", None)


def test_a_redirect_is_a_misconfigured_upstream():
    error = error_from_response(307, b"", {"location": "https://elsewhere/v1"})
    assert (error.status_code, error.is_retryable) == (502, True)
    assert "Unexpected HTTP 307" in error.message


@pytest.mark.parametrize(
    "headers,seconds",
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "7"}, 0.25),
        (
            {"Retry-After": format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True)},
            30.0,
        ),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after-ms": "nan", "retry-after": "2"}, 2.0),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float | None):
    assert parse_retry_after(headers, now=NOW) == seconds
    if seconds is not None:
        assert error_from_response(429, b"", headers, now=NOW).retry_after == seconds


def test_ordinary_stream_chunks_are_no_errors():
    assert error_from_stream_event(b'{"choices":[],"usage":null}', is_error_event=False) is None
    logprob = b'{"choices":[{"logprobs":{"content":[{"token":"error"}]}}]}'
    assert error_from_stream_event(logprob, is_error_event=False) is None
    assert error_from_stream_event(b'{"error":null}', is_error_event=False) is None


@pytest.mark.parametrize(
    "payload,is_error_event,status,message",
    [
        (b'{"error":"overloaded","error_type":"overloaded"}', False, 429, "overloaded"),
        (b'{"error":"CUDA OOM","error_type":"generation"}', False, 424, "CUDA OOM"),
        (b'{"error":"cut","error_type":"incomplete_generation"}', False, 500, "cut"),
        (
            b'{"object":"error","message":"bad","type":"BadRequestError","code":400}',
            False,
            400,
            "bad",
        ),
        (
            b'{"code":503,"message":"Loading model","type":"unavailable_error"}',
            True,
            503,
            "Loading",
        ),
        (b"the server crashed", True, 500, "the server crashed"),
        (b"{}", True, 500, "The upstream reported an error in the stream"),
    ],
)
def test_stream_error_events(payload: bytes, is_error_event: bool, status: int, message: str):
    error = error_from_stream_event(payload, is_error_event=is_error_event)
    assert error is not None
    assert error.status_code == status and message in error.message
