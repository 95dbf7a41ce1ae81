"""OpenAI wire types (pydantic v2) and SSE framing. Pure: no I/O, no titan imports but errors."""

from titan.protocol.chat import (
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    ChatRequestMessage,
    TextContentPart,
)
from titan.protocol.common import (
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
    PromptTokensDetails,
    StreamOptions,
    Usage,
    make_id,
)
from titan.protocol.completions import Completion, CompletionChoice, CompletionRequest
from titan.protocol.envelope import ClientContext, ClientRequest, Endpoint
from titan.protocol.models import ModelCard, ModelList
from titan.protocol.raw import Answer, RawJSON, answer_bytes

__all__ = [
    "Answer",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessage",
    "ChatRequestMessage",
    "ChatTokenLogprob",
    "ChatTopLogprob",
    "ClientContext",
    "ClientRequest",
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "Endpoint",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "RawJSON",
    "StreamOptions",
    "TextContentPart",
    "Usage",
    "answer_bytes",
    "make_id",
]
