"""POST /v1/chat/completions"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from titan.api.parsing import parse_body
from titan.api.responses import answer, answer_stream
from titan.api.state import pipeline_of
from titan.protocol import ChatCompletionRequest


async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    pipeline = pipeline_of(request)
    if body.stream:
        return await answer_stream(request, pipeline.chat_completion_stream(body))
    return await answer(request, pipeline.chat_completion(body))
