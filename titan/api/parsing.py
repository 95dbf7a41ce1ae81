"""Request bodies: orjson to parse, the protocol's pydantic models to check."""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from titan.api.errors import invalid_json, invalid_request_from_validation
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, ClientRequest, CompletionRequest, Endpoint

M = TypeVar("M", bound=BaseModel)

# Far above any prompt a context window holds; stops a client from filling memory.
MAX_BODY_BYTES = 32 * 1024**2
MAX_REQUEST_ID_CHARS = 128
# Headers that steer the pipeline: a session for affinity routing, a total deadline, the
# admission deadline and priority class, cache directives.
ROUTING_HEADERS = (
    "x-titan-session",
    "x-titan-timeout",
    "x-titan-deadline",
    "x-titan-priority",
    "x-titan-cache",
    "x-titan-timings",
    "traceparent",  # W3C trace context: Titan's spans join the caller's trace
    "tracestate",
)


async def read_body(request: Request, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, refused with 413 as soon as it is known to exceed ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise HTTPException(413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HTTPException(413)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request) -> dict[str, Any]:
    body = await read_body(request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(exc) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
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
    return ClientRequest(
        endpoint=endpoint,
        parsed=validate(data, model),
        body=data,
        request_id=request_id_of(request),
        headers={
            name: value
            for name in ROUTING_HEADERS
            if (value := request.headers.get(name)) is not None
        },
        api_key=presented_api_key(request),
        client_host=request.client.host if request.client else None,
    )


def presented_api_key(request: Request) -> str | None:
    """``Authorization: Bearer KEY`` (the openai SDK), else ``api-key`` (Azure's SDKs) or
    ``x-api-key``."""
    authorization = request.headers.get("authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None
