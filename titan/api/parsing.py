"""Request bodies: orjson to parse, the protocol's pydantic models to check."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from titan.api.errors import invalid_json, invalid_request_from_validation
from titan.errors import InvalidRequestError

M = TypeVar("M", bound=BaseModel)

# Far above any prompt a context window holds; stops a client from filling memory.
MAX_BODY_BYTES = 32 * 1024**2


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


async def parse_body(request: Request, model: type[M]) -> M:
    """The body as ``model``; raises InvalidRequestError (400) saying what is wrong."""
    body = await read_body(request)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(exc) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_request_from_validation(exc) from None
