"""POST /v1/responses, GET and DELETE /v1/responses/{response_id}, GET
/v1/responses/{response_id}/input_items: the Responses API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.parsing import client_context, presented_api_key, read_json_object
from titan.api.serialization import EventStreamResponse
from titan.api.state import services_of
from titan.errors import InvalidRequestError
from titan.service import ResponsesService

DEFAULT_ITEMS_LIMIT = 20


def _service(request: Request) -> ResponsesService:
    return services_of(request).responses


async def create_response(request: Request) -> Response:
    data = await read_json_object(request)
    result, response_headers = await _service(request).create(data, client_context(request))
    if isinstance(result, dict):
        return JSONResponse(result, headers=response_headers)
    return EventStreamResponse(result, headers=response_headers)


def _include(request: Request) -> list[str]:
    """``include`` as the openai SDK sends it (``include[]=a&include[]=b``) or repeated."""
    return request.query_params.getlist("include[]") + request.query_params.getlist("include")


async def retrieve_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if request.query_params.get("stream", "false").lower() != "false":
        raise InvalidRequestError(
            "A stored response cannot be streamed again: retrieve it without 'stream'.",
            param="stream",
        )
    service = _service(request)
    return JSONResponse(
        await service.get(response_id, presented_api_key(request), _include(request))
    )


async def list_input_items(request: Request) -> Response:
    query = request.query_params
    limit = query.get("limit", str(DEFAULT_ITEMS_LIMIT))
    if not limit.isdigit():
        raise InvalidRequestError("Invalid 'limit': it must be a positive integer.", param="limit")
    page = await _service(request).input_items(
        request.path_params["response_id"],
        presented_api_key(request),
        order=query.get("order", "desc"),
        after=query.get("after"),
        limit=int(limit),
        include=_include(request),
    )
    return JSONResponse(page)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    return JSONResponse(await _service(request).delete(response_id, presented_api_key(request)))
