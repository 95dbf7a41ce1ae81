"""Wire types shared by chat and completions: request base, sampling fields, usage, logprobs."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from titan.errors import InvalidRequestError

MAX_STOP_SEQUENCES = 16
MAX_N = 128
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's page of a list endpoint: {"object": "list", "data", "first_id", "last_id",
    "has_more"}."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


Parsed = TypeVar("Parsed", bound=BaseModel)


def validated(model: type[Parsed], data: Any, prefix: tuple[str, ...] = ()) -> Parsed:
    """``data`` as ``model``; its first validation error a 400 naming the field (under
    ``prefix`` when the body sits inside another, as a job's does)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in (*prefix, *first["loc"])) or "body"
        raise InvalidRequestError(f"Invalid '{where}': {first['msg']}.", param=where) from None


def make_id(prefix: str) -> str:
    """An OpenAI-style object id such as ``chatcmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


class RequestModel(BaseModel):
    """Base of every request body.

    Unknown fields are ignored (as vLLM does: LiteLLM, langchain and others send vendor fields),
    but every known field is type-checked strictly: "0.5" is not a number and 1 is not a bool.
    """

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # Clients often send `"n": null`; OpenAI reads that as "use the default".
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class ResponseModel(BaseModel):
    """Base of every response body; built by Titan, so no validation beyond the types."""

    model_config = ConfigDict(extra="forbid")


def _validate_stop(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        if len(value) > MAX_STOP_SEQUENCES:
            raise PydanticCustomError(
                "too_many_stop_sequences",
                "at most {max} stop sequences are allowed, got {count}",
                {"max": MAX_STOP_SEQUENCES, "count": len(value)},
            )
        return value
    raise PydanticCustomError("stop_type", "expected a string or an array of strings")


# `str | list[str]` on the wire, always a list once parsed.
# `json_schema_input_type`: the OpenAPI document shows what clients may send.
Stop = Annotated[
    list[str] | None,
    PlainValidator(
        _validate_stop,
        json_schema_input_type=str
        | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)]
        | None,
    ),
]


class StreamOptions(RequestModel):
    include_usage: bool = False


class SamplingFields(RequestModel):
    """Fields common to chat and completions requests, OpenAI's and vLLM's extra ones.

    ``None`` means "the backend's default". Value ranges that SamplingParams checks (temperature,
    top_p, penalties...) are left to it so that there is one rule and one message per parameter.
    """

    model: str | None = None  # None: the server's default model (as vLLM)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling parameters.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's beam search: n (or best_of) beams, score = cum_logprob / num_tokens ** penalty.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's scheduling priority: lower values are served first (and preempted last).
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(
        cls, num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int
    ) -> Usage:
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_completion_tokens,
            total_tokens=num_prompt_tokens + num_completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached_tokens),
        )


class ChatTopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(ResponseModel):
    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(ResponseModel):
    """The legacy completions shape: parallel arrays, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)
