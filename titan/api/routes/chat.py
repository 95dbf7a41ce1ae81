"""POST /v1/chat/completions"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from titan.api.parsing import parse_client_request
from titan.api.serialization import answer, answer_stream
from titan.api.state import flow_of
from titan.protocol import ChatCompletionRequest


async def create_chat_completion(request: Request) -> Response:
    client_request = await parse_client_request(request, "chat", ChatCompletionRequest)
    flow = flow_of(request)
    if client_request.is_stream:
        return await answer_stream(request, client_request, flow.stream(client_request))
    return await answer(request, client_request, flow.complete(client_request))
