"""The fuzzer's own check: every 4xx and 5xx answer carries OpenAI's error body."""

from __future__ import annotations

from typing import Any

import orjson
import schemathesis

ERROR_REF = "#/components/responses/Error"


def _documented_answer(case: schemathesis.Case, status_code: int) -> Any:
    responses = case.operation.definition.raw.get("responses", {})
    range_key = f"{str(status_code)[0]}XX"
    return responses.get(str(status_code), responses.get(range_key, responses.get("default")))


def openai_error_body(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """A 4xx/5xx body is ``{"error": {"message": str, "type": str, "param": str|null,
    "code": str|null}}`` — unless the document declares another body for that status (/ready's
    503 says why it is not ready)."""
    if response.status_code < 400:
        return None
    documented = _documented_answer(case, response.status_code)
    if documented is not None and documented != {"$ref": ERROR_REF}:
        return None
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise AssertionError(
            f"{response.status_code} answer is not JSON: {response.content[:200]!r}"
        ) from None
    error = body.get("error") if isinstance(body, dict) else None
    problems = []
    if not isinstance(error, dict):
        problems.append("no 'error' object")
    else:
        problems += [f"'{key}' is not a string" for key in ("message", "type")
                     if not isinstance(error.get(key), str)]  # fmt: skip
        problems += [f"'{key}' missing or not a string/null" for key in ("param", "code")
                     if key not in error or not isinstance(error[key], str | None)]  # fmt: skip
    if problems:
        raise AssertionError(
            f"{response.status_code} body is not an OpenAI error body ({', '.join(problems)}): "
            f"{response.content[:300]!r}"
        )
    return None


# 504s a client asks for: `x-titan-cache: only-if-cached` on a miss, or an `x-titan-timeout`
# shorter than the answer takes. Every other 5xx is a bug.
ASKED_FOR_504_CODES = {"not_cached", "deadline_exceeded"}


def no_server_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    if response.status_code < 500:
        return None
    if response.status_code == 504:
        try:
            code = orjson.loads(response.content)["error"]["code"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            code = None
        if code in ASKED_FOR_504_CODES:
            return None
    raise AssertionError(f"server error {response.status_code}: {response.content[:300]!r}")
