"""Legacy text completions: the request body and the response (stream chunks share its shape)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator
from pydantic_core import PydanticCustomError

from titan.protocol.common import (
    MAX_N,
    CompletionLogprobs,
    ResponseModel,
    SamplingFields,
    Usage,
)

MAX_COMPLETION_LOGPROBS = 5
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for this endpoint

PromptInput = str | list[str] | list[int] | list[list[int]]


def _is_token_ids(value: Any) -> bool:
    # `type(...) is int`: JSON true/false arrive as bool, which is an int subclass.
    return isinstance(value, list) and all(type(item) is int and item >= 0 for item in value)


def _validate_prompt(value: Any) -> PromptInput:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if not value:
            raise PydanticCustomError("empty_prompt", "the prompt must not be empty")
        if all(isinstance(item, str) for item in value):
            return value
        if _is_token_ids(value):
            return value
        if all(isinstance(item, list) and item and _is_token_ids(item) for item in value):
            return value
    raise PydanticCustomError(
        "prompt_type",
        "expected a string, an array of strings, an array of token ids (integers >= 0) "
        "or an array of non-empty token-id arrays",
    )


Prompt = Annotated[
    PromptInput,
    PlainValidator(
        _validate_prompt,
        json_schema_input_type=str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1),
        ],
    ),
]


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int = Field(DEFAULT_COMPLETION_MAX_TOKENS, ge=1)
    suffix: str | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    # vLLM's guided decoding extras (structured output by constrained decoding): at most one.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt on its own: a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(type(item) is int for item in self.prompt):
            return [list(self.prompt)]  # type: ignore[arg-type]
        return list(self.prompt)  # type: ignore[arg-type]


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class Completion(ResponseModel):
    """A whole completion, or one stream chunk of it (same object type, as OpenAI does)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
