"""GET /v1/models and GET /v1/models/{model}"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from titan.api.serialization import json_response
from titan.api.state import flow_of, pipeline_of
from titan.protocol import ModelList


async def list_models(request: Request) -> Response:
    services = pipeline_of(request).services
    if services is None:  # the models are still loading: none listed yet
        return json_response(ModelList(data=[]))
    return json_response(services.flow.models.list())


async def retrieve_model(request: Request) -> Response:
    return json_response(flow_of(request).models.card(request.path_params["model"]))
