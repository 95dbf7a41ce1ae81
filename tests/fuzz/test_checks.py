"""The fuzzer's checks refuse what they must (so a passing fuzz run means something)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import requests
import schemathesis

from tests.fuzz.checks import no_server_error, openai_error_body
from tests.fuzz.conftest import titan_schema

OPENAI_ERROR = {"error": {"message": "No.", "type": "invalid_request_error", "param": None,
                          "code": None}}  # fmt: skip


def _answer(status_code: int, body: object) -> schemathesis.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return schemathesis.Response(
        status_code, {"content-type": ["application/json"]}, content,
        request=requests.PreparedRequest(), elapsed=0.01, verify=True,
    )  # fmt: skip


def _run(check: Any, status_code: int, body: object, case: schemathesis.Case) -> bool | None:
    return check(None, _answer(status_code, body), case)  # no check reads its context


@pytest.fixture(scope="module")
def case() -> schemathesis.Case:
    return titan_schema()["/v1/models"]["GET"].Case()


@pytest.mark.parametrize(
    "body",
    [
        {"detail": "Not Found"},  # Starlette's own shape
        b"Internal Server Error",  # not JSON
        {"error": "bad"},
        {"error": {"message": "x", "type": "y"}},  # param and code missing
        {"error": {"message": "x", "type": "y", "param": 3, "code": None}},
        [OPENAI_ERROR],
    ],
)
def test_a_non_openai_error_body_fails_the_check(case: schemathesis.Case, body: object):
    with pytest.raises(AssertionError, match="not"):
        _run(openai_error_body, 400, body, case)


def test_an_openai_error_body_and_any_success_pass(case: schemathesis.Case):
    assert _run(openai_error_body, 404, OPENAI_ERROR, case) is None
    assert _run(openai_error_body, 200, {"detail": "ok"}, case) is None


def test_server_errors_fail_but_the_504s_a_client_asked_for(case: schemathesis.Case):
    internal = {"error": {**OPENAI_ERROR["error"], "type": "server_error", "code": "internal"}}
    for status_code in (500, 502, 503, 504):
        with pytest.raises(AssertionError, match="server error"):
            _run(no_server_error, status_code, internal, case)
    for code in ("not_cached", "deadline_exceeded"):
        asked = {"error": {**OPENAI_ERROR["error"], "type": "timeout", "code": code}}
        assert _run(no_server_error, 504, asked, case) is None
    assert _run(no_server_error, 429, OPENAI_ERROR, case) is None


def test_a_failure_documented_with_its_own_body_is_not_held_to_the_error_shape():
    schema = titan_schema()
    loading = {"status": "loading"}
    assert _run(openai_error_body, 503, loading, schema["/ready"]["GET"].Case()) is None
    with pytest.raises(AssertionError, match="not an OpenAI error body"):
        _run(openai_error_body, 503, loading, schema["/health"]["GET"].Case())
