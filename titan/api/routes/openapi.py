"""GET /openapi.json: the OpenAPI document of the app serving the request, built on first use
and kept on the app as bytes (the routes do not change while it runs). Open, like /health."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from titan.api.openapi import build_openapi_document

_CACHE_ATTRIBUTE = "titan_openapi_json"


async def openapi_document(request: Request) -> Response:
    app_state = request.app.state
    encoded = getattr(app_state, _CACHE_ATTRIBUTE, None)
    if encoded is None:
        encoded = orjson.dumps(build_openapi_document(request.app.routes))
        setattr(app_state, _CACHE_ATTRIBUTE, encoded)
    return Response(encoded, media_type="application/json")
