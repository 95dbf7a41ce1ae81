"""POST /v1/responses, GET and DELETE /v1/responses/{response_id}: the Responses API."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.parsing import ROUTING_HEADERS, presented_api_key, read_json_object
from titan.api.responses import EventStreamResponse
from titan.api.state import pipeline_of
from titan.service import ResponsesService


def _service(request: Request) -> ResponsesService:
    return ResponsesService(pipeline_of(request))


async def create_response(request: Request) -> Response:
    data = await read_json_object(request)
    headers = {name: value for name in ROUTING_HEADERS if (value := request.headers.get(name))}
    result, response_headers = await _service(request).create(
        data,
        presented_api_key(request),
        request.client.host if request.client else None,
        headers,
    )
    if isinstance(result, dict):
        return JSONResponse(result, headers=response_headers)
    return EventStreamResponse(result, headers=response_headers)


async def retrieve_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    return JSONResponse(await _service(request).get(response_id, presented_api_key(request)))


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    return JSONResponse(await _service(request).delete(response_id, presented_api_key(request)))
