"""The headers that steer Titan, parsed once by the HTTP layer (api/parsing.py): x-titan-timeout
and x-titan-deadline become ClientRequest's seconds, or an OpenAI-style 400 that says why."""

from __future__ import annotations

import math

import httpx
import pytest

from titan.api.parsing import deadline_s, timeout_s
from titan.errors import InvalidRequestError

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_timeouts_are_positive_seconds():
    assert timeout_s(None) is None
    assert timeout_s("2.5") == 2.5
    assert timeout_s("inf") == math.inf  # no total deadline at all
    for bad in ("0", "-1", "soon", "nan", ""):
        with pytest.raises(InvalidRequestError, match="x-titan-timeout"):
            timeout_s(bad)


def test_deadlines_are_finite_positive_seconds():
    assert deadline_s(None) is None
    assert deadline_s("20") == 20.0
    for bad in ("0", "inf", "soon", "nan"):
        with pytest.raises(InvalidRequestError, match="x-titan-deadline"):
            deadline_s(bad)


@pytest.mark.parametrize("header", ["x-titan-timeout", "x-titan-deadline"])
async def test_a_bad_header_is_a_400_naming_it(client: httpx.AsyncClient, header: str):
    response = await client.post("/v1/chat/completions", json=CHAT, headers={header: "soon"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and header in error["message"]


async def test_good_headers_serve_the_request(client: httpx.AsyncClient):
    headers = {"x-titan-timeout": "30", "x-titan-deadline": "20"}
    response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200
