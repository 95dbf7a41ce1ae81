"""GET /v1/models and GET /v1/models/{model}"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from titan.api.serialization import json_response
from titan.api.state import pipeline_of


async def list_models(request: Request) -> Response:
    return json_response(pipeline_of(request).list_models())


async def retrieve_model(request: Request) -> Response:
    return json_response(pipeline_of(request).get_model(request.path_params["model"]))
