"""Agent state: GET | PUT | PATCH | DELETE /v1/agents/{agent_id}/state (JSON merge patch for
PATCH, ETag / If-Match for optimistic concurrency, ``?ttl_s=`` for expiry)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from titan.api.parsing import presented_api_key, read_json_object
from titan.api.state import services_of
from titan.errors import InvalidRequestError
from titan.service.agents import AgentService, AgentState


def _service(request: Request) -> AgentService:
    return services_of(request).agents


def _ttl_s(request: Request) -> float | None:
    value = request.query_params.get("ttl_s")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise InvalidRequestError(
            f"Invalid ttl_s {value[:50]!r}: give seconds, e.g. ttl_s=3600.", param="ttl_s"
        ) from None


def _answer(state: AgentState, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(state.state),
        status_code=status_code,
        media_type="application/json",
        headers={"ETag": state.etag},
    )


async def get_state(request: Request) -> Response:
    service = _service(request)
    state = await service.get(presented_api_key(request), request.path_params["agent_id"])
    return _answer(state)


async def _write(request: Request, replace: bool) -> Response:
    service = _service(request)
    write = service.put if replace else service.patch
    state = await write(
        presented_api_key(request),
        request.path_params["agent_id"],
        await read_json_object(request),
        request.headers.get("if-match"),
        _ttl_s(request),
    )
    return _answer(state, 201 if state.is_created else 200)


async def put_state(request: Request) -> Response:
    return await _write(request, replace=True)


async def patch_state(request: Request) -> Response:
    return await _write(request, replace=False)


async def delete_state(request: Request) -> Response:
    service = _service(request)
    await service.delete(
        presented_api_key(request), request.path_params["agent_id"], request.headers.get("if-match")
    )
    return Response(status_code=204)
