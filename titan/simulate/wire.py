"""The OpenAI wire format of simulated answers, as plain dicts, and lenient request reading.

The standalone server encodes these dicts with orjson directly (it is the upstream of the gateway
overhead benchmark and must cost little); the in-process backend validates them into
titan.protocol objects.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from titan.simulate.behaviour import Failure, RequestPlan

SimulatedEndpoint = Literal["chat", "completion"]
CHARS_PER_TOKEN = 4  # a rough English average: prompt usage is an estimate


# ---- requests ------------------------------------------------------------------------------


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    """``max_completion_tokens`` (the newer name) or ``max_tokens``; None if absent or odd."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if type(value) is int and value >= 1:  # `type(...) is int`: JSON true is not a count
            return value
    return None


def wants_stream(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _num_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, int):
        return CHARS_PER_TOKEN  # a token id
    if isinstance(value, list):
        return sum(_num_chars(item) for item in value)
    if isinstance(value, dict):  # a message, or a {"type": "text", "text": ...} content part
        return _num_chars(value.get("content", value.get("text")))
    return 0


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """The prompt's size in tokens, estimated from its characters (no tokenizer here)."""
    prompt = body["messages"] if "messages" in body else body.get("prompt")
    return max(1, _num_chars(prompt) // CHARS_PER_TOKEN)


# ---- answers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnswerHead:
    """What every object of one answer shares."""

    endpoint: SimulatedEndpoint
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, endpoint: SimulatedEndpoint, model: str) -> AnswerHead:
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        return cls(endpoint, f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)

    def envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }


def whole_answer(head: AnswerHead, plan: RequestPlan, num_prompt_tokens: int) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` or ``text_completion``."""
    text = plan.text
    if head.endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        kind = "text_completion"
    choice |= {"logprobs": None, "finish_reason": plan.finish_reason}
    answer = head.envelope(kind, [choice])
    answer["usage"] = usage(num_prompt_tokens, plan.num_output_tokens)
    return answer


def _chunk(head: AnswerHead, content: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason}
    kind = "chat.completion.chunk" if head.endpoint == "chat" else "text_completion"
    return head.envelope(kind, [choice])


def token_chunk(head: AnswerHead, text: str, *, is_first: bool) -> dict[str, Any]:
    """One token's stream chunk; a chat stream's first one also carries the role."""
    if head.endpoint == "chat":
        delta = {"role": "assistant", "content": text} if is_first else {"content": text}
        return _chunk(head, {"delta": delta}, None)
    return _chunk(head, {"text": text}, None)


def finish_chunk(head: AnswerHead, finish_reason: str) -> dict[str, Any]:
    content = {"delta": {}} if head.endpoint == "chat" else {"text": ""}
    return _chunk(head, content, finish_reason)


def usage_chunk(head: AnswerHead, num_prompt_tokens: int, plan: RequestPlan) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    kind = "chat.completion.chunk" if head.endpoint == "chat" else "text_completion"
    chunk = head.envelope(kind, [])
    chunk["usage"] = usage(num_prompt_tokens, plan.num_output_tokens)
    return chunk


# ---- errors --------------------------------------------------------------------------------


def error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(message: str, status: int, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    error = {"message": message, "type": error_type(status), "param": None, "code": code}
    return {"error": error}


def failure_body(failure: Failure) -> dict[str, Any]:
    return error_body(failure.message, failure.status or 500, f"simulated_{failure.cause}")
