"""The one place where errors become HTTP responses, all in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.

- titan.errors.TitanError → its ``status_code`` and ``to_body()`` (Retry-After on rate limits);
- request bodies that are not JSON, or do not validate → 400 naming the parameter;
- unknown routes → 404, wrong methods → 405, oversized bodies → 413, slow bodies → 408;
- anything else → 500 without a traceback (the traceback goes to the log).
"""

from __future__ import annotations

import logging
import math
import re
from http import HTTPStatus
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from titan.errors import InvalidRequestError, TitanError

logger = logging.getLogger("titan.api")

INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request."


def _body(message: str, error_type: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _json(
    body: dict[str, Any], status_code: int, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(body), status_code=status_code, headers=headers, media_type="application/json"
    )


def error_body(exc: BaseException) -> dict[str, Any]:
    """The OpenAI error body for any exception (also used for errors inside a stream)."""
    if isinstance(exc, TitanError):
        return exc.to_body()
    return _body(INTERNAL_ERROR_MESSAGE, "server_error", "internal_error")


def error_response(exc: TitanError) -> Response:
    headers = dict(getattr(exc, "headers", None) or {})  # x-ratelimit-* on rate limits
    retry_after = getattr(exc, "retry_after", None)  # rate limits, upstream refusals, 503s
    if retry_after is not None and math.isfinite(retry_after):
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return _json(exc.to_body(), exc.status_code, headers or None)


# ---- request validation ------------------------------------------------------------------


def param_path(loc: tuple[str | int, ...]) -> str:
    """``("messages", 0, "content")`` → ``"messages[0].content"``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


_QUOTABLE = re.compile(r"[A-Za-z0-9_.:/-]{0,24}")


def _describe(value: Any) -> str:
    """A short JSON-flavoured description of a bad input, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # Only a short token (an enum typo like "usr") is quoted back: free text may be a
        # prompt, and an error body can end up in the client's logs.
        if _QUOTABLE.fullmatch(value):
            return f"the string {orjson.dumps(value).decode()}"
        return f"a string of {_plural(len(value), 'character')}"
    if isinstance(value, list):
        return f"an array of {_plural(len(value), 'item')}"
    return "an object"


def _plural(count: Any, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def invalid_request_from_validation(exc: ValidationError) -> InvalidRequestError:
    """A 400 about the first problem pydantic found, naming the parameter by its path."""
    error = exc.errors(include_url=False)[0]
    param = param_path(error["loc"]) or None
    error_type, context, value = error["type"], error.get("ctx") or {}, error.get("input")
    if error_type == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    if error_type in ("too_short", "too_long"):
        bound = "at least" if error_type == "too_short" else "at most"
        limit = context.get("min_length" if error_type == "too_short" else "max_length")
        detail = f"expected {bound} {_plural(limit, 'item')}, got {context.get('actual_length')}"
    else:
        detail = error["msg"]
        detail = detail[0].lower() + detail[1:] if detail.startswith("Input") else detail
        if not isinstance(value, dict):  # an object is described well enough by the message
            detail += f", got {_describe(value)}"
    return InvalidRequestError(f"Invalid value for '{param}': {detail}.", param=param)


def invalid_json(exc: orjson.JSONDecodeError) -> InvalidRequestError:
    return InvalidRequestError(f"The request body is not valid JSON: {exc}.", code="invalid_json")


# ---- handlers ------------------------------------------------------------------------------


async def _titan_error_handler(request: Request, exc: TitanError) -> Response:
    # Refusals under load (admission logs each one itself) and cache misses are not failures.
    if exc.status_code >= 500 and not exc.is_expected:
        logger.error("request failed: %s", exc.message, extra={"path": request.url.path})
    return error_response(exc)


async def _http_exception_handler(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = f"Unknown URL: {request.method} {request.url.path}."
        body = _body(message, "invalid_request_error", "not_found")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        body = _body(
            f"Method {request.method} is not allowed for {request.url.path}"
            + (f"; use {allowed}." if allowed else "."),
            "invalid_request_error",
            "method_not_allowed",
        )
    elif exc.status_code == 413:
        message = (
            exc.detail if exc.detail != HTTPStatus(413).phrase else "The request body is too large."
        )
        body = _body(message, "invalid_request_error", "body_too_large")
    elif exc.status_code == 408:
        body = _body(str(exc.detail), "invalid_request_error", "request_timeout")
    else:
        error_type = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        body = _body(str(exc.detail), error_type, None)
    return _json(body, exc.status_code, dict(exc.headers or {}))


def exception_handlers() -> dict[Any, Any]:
    return {TitanError: _titan_error_handler, HTTPException: _http_exception_handler}


class CatchAllMiddleware:
    """Turns any exception that escaped the handlers into a 500 OpenAI body, and logs it.

    It sits inside Starlette's ServerErrorMiddleware, which would otherwise answer in plain text
    (or with a traceback in debug mode) and re-raise into the server's own log.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        has_started = False

        async def tracking_send(message: Message) -> None:
            nonlocal has_started
            has_started = has_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            logger.exception(
                "unhandled error", extra={"method": scope.get("method"), "path": scope.get("path")}
            )
            if not has_started:
                body = _body(INTERNAL_ERROR_MESSAGE, "server_error", "internal_error")
                await _json(body, 500)(scope, receive, send)
