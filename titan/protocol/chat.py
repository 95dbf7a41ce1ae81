"""Chat completions: the request body, the response and its stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from titan.errors import InvalidRequestError
from titan.protocol.common import (
    ChatLogprobs,
    RequestModel,
    ResponseModel,
    SamplingFields,
    Usage,
)

MAX_TOP_LOGPROBS = 20

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class TextContentPart(RequestModel):
    type: Literal["text"] = "text"
    text: str


def _validate_content(value: Any) -> str | list[TextContentPart]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("content_type", "expected a string or an array of content parts")
    parts = []
    for index, part in enumerate(value):
        if not isinstance(part, dict):
            raise PydanticCustomError(
                "content_part_type",
                "content part {index} must be an object with 'type' and 'text'",
                {"index": index},
            )
        kind = part.get("type")
        if kind != "text":
            raise PydanticCustomError(
                "unsupported_content_part",
                "content part {index} has type '{kind}'; only 'text' parts are supported",
                {"index": index, "kind": str(kind)},
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise PydanticCustomError(
                "content_part_text",
                "content part {index} needs a string 'text'",
                {"index": index},
            )
        parts.append(TextContentPart(text=text))
    return parts


# A string or a list of {"type": "text", "text": ...} parts; other part types are refused.
Content = Annotated[
    str | list[TextContentPart] | None,
    PlainValidator(_validate_content, json_schema_input_type=str | list[TextContentPart]),
]


def _content_in_schema(schema: dict[str, Any]) -> None:
    # The schema asks for content on every turn: only an assistant turn that called tools may
    # leave it out, a case JSON Schema would need if/then for.
    schema["required"] = [*schema.get("required", []), "content"]


class ChatRequestMessage(RequestModel):
    model_config = RequestModel.model_config | {"json_schema_extra": _content_in_schema}

    role: Role
    content: Content = None
    name: str | None = None
    # An assistant turn's calls and a tool result's call id (the embedded backend renders them;
    # titan/backends/embedded/tools.py checks their shape).
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatRequestMessage:
        # Only an assistant turn that called tools may omit its content.
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError(
                "missing_content", "'content' is required for role '{role}'", {"role": self.role}
            )
        return self

    @property
    def text(self) -> str:
        """The content as one string (text parts joined by newlines, as vLLM does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


def _validate_tool_choice(value: Any) -> str | dict[str, Any]:
    if value in ("none", "auto", "required") or isinstance(value, dict):
        return value
    raise PydanticCustomError(
        "tool_choice_type", "expected 'none', 'auto', 'required' or an object naming a tool"
    )


ToolChoice = Annotated[
    str | dict[str, Any] | None,
    PlainValidator(
        _validate_tool_choice,
        json_schema_input_type=Literal["none", "auto", "required"] | dict[str, Any] | None,
    ),
]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatRequestMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    # vLLM's guided decoding extras (structured output by constrained decoding): at most one.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError(
                "Invalid value for 'top_logprobs': 'logprobs' must be true to use 'top_logprobs'.",
                param="top_logprobs",
            )
        return self

    @property
    def max_output_tokens(self) -> int | None:
        """``max_completion_tokens`` (the newer name) wins over ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """How many alternatives per token the engine should return; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class ToolCallFunction(ResponseModel):
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it


class ToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _omit_no_tool_calls(self, serialize: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # "content": null stays (OpenAI sends it); "tool_calls" only when the model called tools.
        body = serialize(self)
        if body.get("tool_calls") is None:
            body.pop("tool_calls", None)
        return body


class ChatCompletionChoice(ResponseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletion(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class _OmitNone(ResponseModel):
    @model_serializer(mode="wrap")
    def _omit_unset(self, serialize: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # OpenAI's deltas carry only what changed: a call's id and name once, then arguments.
        return {key: value for key, value in serialize(self).items() if value is not None}


class ToolCallFunctionDelta(_OmitNone):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_OmitNone):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunctionDelta | None = None


class ChatDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, serialize: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # OpenAI sends only what changed: {"content": "Hi"}, {"role": "assistant"}, {}.
        return {key: value for key, value in serialize(self).items() if value is not None}


class ChatChunkChoice(ResponseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
