"""Request bodies: orjson to parse, the protocol's pydantic models to check."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from titan.api.bounds import check_json, check_request
from titan.api.errors import invalid_json, invalid_request_from_validation
from titan.api.state import limits_of
from titan.config import RequestLimits
from titan.errors import InvalidRequestError
from titan.protocol import (
    ChatCompletionRequest,
    ClientContext,
    ClientRequest,
    CompletionRequest,
    Endpoint,
)

M = TypeVar("M", bound=BaseModel)

MAX_REQUEST_ID_CHARS = 128
# Headers that steer the pipeline: a session for affinity routing, the priority class, cache
# directives (x-titan-timeout and x-titan-deadline are parsed into ClientContext's seconds).
ROUTING_HEADERS = (
    "x-titan-session",
    "x-titan-priority",
    "x-titan-cache",
    "x-titan-timings",
    "traceparent",  # W3C trace context: Titan's spans join the caller's trace
    "tracestate",
)


async def read_body(request: Request, limits: RequestLimits | None = None) -> bytes:
    """The whole body: 413 as soon as it is known to exceed ``limits.max_body_bytes``, 408 when
    it has not all arrived within ``limits.body_timeout_s`` (a slow or stalled client)."""
    limits = limits or limits_of(request)
    max_bytes = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _body_too_large(max_bytes)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise _body_too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(
            408,
            f"The request body did not arrive within {limits.body_timeout_s:g} s; send it "
            "faster (the limit is server.limits.body_timeout_s).",
            headers={"Connection": "close"},
        ) from None
    return b"".join(chunks)


def _body_too_large(max_bytes: int) -> HTTPException:
    return HTTPException(
        413,
        f"The request body is larger than {max_bytes} bytes; send less (the limit is "
        "server.limits.max_body_bytes).",
    )


async def read_json_object(request: Request) -> dict[str, Any]:
    limits = limits_of(request)
    body = await read_body(request, limits)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(exc) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    check_json(body, data, limits)
    return data


def validate(data: dict[str, Any], model: type[M]) -> M:
    """``data`` as ``model``; raises InvalidRequestError (400) saying what is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_request_from_validation(exc) from None


async def parse_body(request: Request, model: type[M]) -> M:
    return validate(await read_json_object(request), model)


def request_id_of(request: Request) -> str:
    """The client's x-request-id when it is a sane one (tracing across services), else a new
    one."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isprintable():
        return given
    return f"req-{uuid.uuid4().hex}"


async def parse_client_request(
    request: Request, endpoint: Endpoint, model: type[ChatCompletionRequest | CompletionRequest]
) -> ClientRequest:
    data = await read_json_object(request)
    parsed = validate(data, model)
    check_request(parsed, limits_of(request))
    return ClientRequest.sent(
        client_context(request), endpoint, parsed, data, request_id_of(request)
    )


def client_context(request: Request) -> ClientContext:
    """The caller's key and address, and the headers that steer the pipeline."""
    headers = request.headers
    return ClientContext(
        headers={
            name: value for name in ROUTING_HEADERS if (value := headers.get(name)) is not None
        },
        api_key=presented_api_key(request),
        client_host=request.client.host if request.client else None,
        timeout_s=timeout_s(headers.get("x-titan-timeout")),
        deadline_s=deadline_s(headers.get("x-titan-deadline")),
    )


def timeout_s(header: str | None) -> float | None:
    """``x-titan-timeout``: the request's total deadline in seconds (None: not given)."""
    if header is None:
        return None
    seconds = _seconds(header)
    if not seconds > 0:
        raise InvalidRequestError(
            f"Invalid x-titan-timeout header {header!r}: give the request's total deadline "
            "in seconds, e.g. 'x-titan-timeout: 30'."
        )
    return seconds


def deadline_s(header: str | None) -> float | None:
    """``x-titan-deadline``: the seconds within which the answer is still useful (None: not
    given); admission refuses at once what it cannot start in time."""
    if header is None:
        return None
    seconds = _seconds(header)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InvalidRequestError(
            f"Invalid x-titan-deadline header {header!r}: give the seconds within which the "
            "answer is still useful, e.g. 'x-titan-deadline: 20'."
        )
    return seconds


def _seconds(header: str) -> float:
    try:
        return float(header)
    except ValueError:
        return -1.0  # refused as not positive


def presented_api_key(request: Request) -> str | None:
    """``Authorization: Bearer KEY`` (the openai SDK), else ``api-key`` (Azure's SDKs) or
    ``x-api-key``."""
    authorization = request.headers.get("authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None
