"""The body of POST /v1/responses: its fields, checked (400s name the field), and the parts of
it that become the chat completion's: ``include``, ``text.format``, logprobs. The tools are
titan/service/response_tools.py's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from titan.config import Settings
from titan.errors import InvalidRequestError
from titan.protocol.common import validated

# Every value OpenAI's ``include`` takes (the SDK's ResponseIncludable). Honoured: the
# file_search results and the output's logprobs; the others name things Titan never produces
# (web search, images, code interpreter, reasoning), so asking for them changes nothing.
INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
# Fields OpenAI takes as null too, meaning their default.
_NULL_IS_DEFAULT = ("store", "stream", "metadata", "tools", "parallel_tool_calls", "text")
FILE_SEARCH_RESULTS = "file_search_call.results"
LOGPROBS = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20


class ResponsesBody(Settings):
    # Fields Titan neither uses nor refuses (service_tier, reasoning, stream_options,
    # context_management, moderation, ...) are accepted and ignored, as upstreams do; the
    # known ones are checked strictly, as chat completions' are ("yes" is not a boolean).
    model_config = Settings.model_config | {"extra": "ignore", "strict": True}
    model: str | None = None
    input: Any
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    metadata: dict[str, str] = Field(default_factory=dict)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = None  # checked by response_tools.plan_tools
    parallel_tool_calls: bool = True
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    # Echoed, not used: Titan's prefix caching needs no key; Titan keeps no per-user policy.
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Refused when set: Titan cannot do what they ask (see check_supported).
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None or k not in _NULL_IS_DEFAULT}
        return data

    @property
    def includes(self) -> frozenset[str]:
        return frozenset(self.include or ())


def parse_body(data: Mapping[str, Any]) -> ResponsesBody:
    body = validated(ResponsesBody, data)
    check_include(body.include)
    check_supported(body)
    return body


def check_include(values: Iterable[str] | None) -> frozenset[str]:
    """``include`` (of a create, a retrieve or an input items listing) as a set; an unknown
    value is a 400 naming ``include``."""
    for value in values or ():
        if value not in INCLUDABLE:
            raise InvalidRequestError(
                f"Invalid value for 'include': {value!r}. Supported values are: "
                + ", ".join(repr(v) for v in INCLUDABLE)
                + ".",
                param="include",
            )
    return frozenset(values or ())


def check_supported(body: ResponsesBody) -> None:
    if body.background:
        raise InvalidRequestError(
            "'background' responses are not supported: Titan answers in the request (use "
            "'stream', or /v1/jobs for work that outlives it).",
            param="background",
        )
    if body.conversation is not None:
        raise InvalidRequestError(
            "The Conversations API is not supported: continue with 'previous_response_id'.",
            param="conversation",
        )
    if body.prompt is not None:
        raise InvalidRequestError(
            "Stored prompt templates are not supported: send 'instructions' and 'input'.",
            param="prompt",
        )


def response_format(text: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as the chat completion's ``response_format`` (None: plain text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise InvalidRequestError("'text.format' must be an object.", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidRequestError(
            f"Invalid 'text.format.type' {kind!r}: use text, json_object or json_schema.",
            param="text.format.type",
        )
    if not isinstance(fmt.get("name"), str) or not fmt["name"]:
        raise InvalidRequestError(
            "'text.format.name' must name the schema.", param="text.format.name"
        )
    if not isinstance(fmt.get("schema"), Mapping):
        raise InvalidRequestError(
            "'text.format.schema' must be a JSON Schema object.", param="text.format.schema"
        )
    json_schema = {
        key: fmt[key]
        for key in ("name", "schema", "strict", "description")
        if fmt.get(key) is not None
    }
    return {"type": "json_schema", "json_schema": json_schema}


def chat_options(body: ResponsesBody) -> dict[str, Any]:
    """The chat completion's sampling, output and logprobs fields for ``body``."""
    options: dict[str, Any] = {
        "max_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "response_format": response_format(body.text),
    }
    if LOGPROBS in body.includes:
        options["logprobs"] = True
        options["top_logprobs"] = body.top_logprobs
    return {key: value for key, value in options.items() if value is not None}


def output_logprobs(chat_logprobs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A chat choice's (or chunk's) ``logprobs.content`` as output_text logprobs."""
    return [
        {
            "token": entry["token"],
            "bytes": entry.get("bytes") or list(entry["token"].encode()),
            "logprob": entry["logprob"],
            "top_logprobs": [
                {
                    "token": top["token"],
                    "bytes": top.get("bytes") or list(top["token"].encode()),
                    "logprob": top["logprob"],
                }
                for top in entry.get("top_logprobs") or ()
            ],
        }
        for entry in (chat_logprobs or {}).get("content") or ()
    ]
