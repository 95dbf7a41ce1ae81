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
from titan.protocol.models import ModelCard, ModelList

__all__ = [
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
    "Completion",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "ModelCard",
    "ModelList",
    "PromptTokensDetails",
    "StreamOptions",
    "TextContentPart",
    "Usage",
    "make_id",
]
