"""Protocol ↔ engine conversions for the embedded backend: pure functions, no engine state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from titan.engine.outputs import FinishReason, TokenLogprob
from titan.engine.sampling_params import SamplingParams, StructuredOutput
from titan.errors import ContextLengthExceededError, InvalidRequestError, ServiceUnavailableError
from titan.protocol import (
    ChatCompletionRequest,
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
    CompletionRequest,
)
from titan.protocol.common import SamplingFields

# JSON has no -inf; vLLM clamps the same way.
MIN_LOGPROB = -9999.0


def _not_supported(feature: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{feature} is not supported by the embedded model yet.", param=param
    )


def check_chat_supported(request: ChatCompletionRequest) -> None:
    """Refuse, with a 400 naming the parameter, what the embedded engine cannot do yet."""
    if request.logit_bias:
        raise _not_supported("'logit_bias'", "logit_bias")


def check_completion_supported(request: CompletionRequest) -> None:
    if request.suffix:
        raise _not_supported("'suffix'", "suffix")
    if request.logit_bias:
        raise _not_supported("'logit_bias'", "logit_bias")
    if request.echo and request.logprobs is not None:
        raise _not_supported("'echo' together with 'logprobs' (prompt logprobs)", "echo")


def resolve_max_tokens(
    requested: int | None, num_prompt_tokens: int, max_model_len: int, prompt_param: str
) -> int:
    """The completion budget; unset means "whatever room the context window leaves" (vLLM)."""
    if requested is None:
        if num_prompt_tokens >= max_model_len:
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"{prompt_param} resulted in {num_prompt_tokens} tokens, which leaves no room "
                f"for the completion. Please reduce the length of the {prompt_param}.",
                param=prompt_param,
            )
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + requested > max_model_len:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the "
            f"{prompt_param}, {requested} in the completion). Please reduce the length of the "
            f"{prompt_param} or completion.",
            param=prompt_param,
        )
    return requested


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def sampling_params(
    request: SamplingFields, *, max_tokens: int, num_logprobs: int | None, seed: int | None
) -> SamplingParams:
    """Raises InvalidRequestError naming the parameter when a value is out of range."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_or(request.temperature, 1.0),  # OpenAI's default
        top_p=_or(request.top_p, 1.0),
        top_k=_or(request.top_k, 0),
        min_p=_or(request.min_p, 0.0),
        seed=seed,
        presence_penalty=_or(request.presence_penalty, 0.0),
        frequency_penalty=_or(request.frequency_penalty, 0.0),
        repetition_penalty=_or(request.repetition_penalty, 1.0),
        min_tokens=request.min_tokens,
        stop=tuple(request.stop or ()),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        logprobs=num_logprobs,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        structured=structured_output(request),
    )


# vLLM's guided decoding fields and the constraint kind each one asks for.
_GUIDED_KINDS = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def structured_output(request: SamplingFields) -> StructuredOutput | None:
    """``response_format`` (chat) or one ``guided_*`` field → the engine's output constraint.
    Raises InvalidRequestError naming the field when it is malformed or combined with another."""
    given = [name for name in _GUIDED_KINDS if getattr(request, name, None) is not None]
    response_format = getattr(request, "response_format", None)
    if response_format is not None and response_format.type != "text":
        given.insert(0, "response_format")
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequestError(
            f"Invalid value for '{given[1]}': only one of {', '.join(given)} may be given "
            "(each constrains the whole output).",
            param=given[1],
        )
    name = given[0]
    if name == "response_format":
        return _response_format_constraint(response_format)
    value = getattr(request, name)
    if name == "guided_json":
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        return StructuredOutput("json_schema", text, param=name)
    if name == "guided_choice":
        return StructuredOutput("choice", choices=tuple(value), param=name)
    return StructuredOutput(_GUIDED_KINDS[name], value, param=name)


def _response_format_constraint(response_format: Any) -> StructuredOutput:
    if response_format.type == "json_object":
        return StructuredOutput("json_object", param="response_format")
    # OpenAI's shape: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}.
    # The output is constrained whatever "strict" says (constraining is what makes it strict).
    spec = response_format.json_schema
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InvalidRequestError(
            "Invalid value for 'response_format': type 'json_schema' needs "
            "'json_schema.schema', a JSON Schema object.",
            param="response_format",
        )
    return StructuredOutput("json_schema", orjson.dumps(schema).decode(), param="response_format")


def choice_seed(seed: int | None, choice: int) -> int | None:
    """Each of the n choices gets its own seed, so that they differ yet stay reproducible."""
    return None if seed is None else seed + choice


def finish_reason(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    if reason is FinishReason.ABORT:
        # The client that asked is gone when it aborts; what is left is a shutdown.
        raise ServiceUnavailableError("The request was aborted: the server is shutting down.")
    return reason.value


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def chat_logprobs(logprobs: Sequence[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=entry.token,
                logprob=_clamp(entry.logprob),
                bytes=list(entry.token_bytes),
                top_logprobs=[
                    ChatTopLogprob(
                        token=top.token, logprob=_clamp(top.logprob), bytes=list(top.token_bytes)
                    )
                    for top in entry.top
                ],
            )
            for entry in logprobs
        ]
    )


def completion_logprobs(
    logprobs: Sequence[TokenLogprob], text_offset: int
) -> tuple[CompletionLogprobs, int]:
    """The legacy shape, offsets counted from ``text_offset``; also returns the next offset."""
    result = CompletionLogprobs()
    for entry in logprobs:
        result.tokens.append(entry.token)
        result.token_logprobs.append(_clamp(entry.logprob))
        top = {alternative.token: _clamp(alternative.logprob) for alternative in entry.top}
        top.setdefault(entry.token, _clamp(entry.logprob))  # the chosen token is always listed
        result.top_logprobs.append(top)
        result.text_offset.append(text_offset)
        text_offset += len(entry.token)
    return result, text_offset
