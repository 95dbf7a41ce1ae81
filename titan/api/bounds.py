"""Bounds on what one request may carry (``server.limits``): JSON nesting, NUL characters,
messages per request, characters per message, ``n`` and stop sequences. Each breach is a 400
that names the parameter, says the limit and how to get under it.
"""

from __future__ import annotations

from typing import Any

from titan.api.errors import param_path
from titan.config import RequestLimits
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, CompletionRequest


def check_json(body: bytes, data: Any, limits: RequestLimits) -> None:
    """Refuses nesting deeper than ``max_json_depth`` and strings holding NUL characters.

    Both walks are skipped when the raw bytes already rule the problem out (fewer brackets than
    the depth limit; no ``\\u0000`` escape, the only way JSON carries a NUL), so ordinary bodies
    cost two byte scans. The walk is iterative: no recursion limit to hit.
    """
    may_be_deep = body.count(b"[") + body.count(b"{") > limits.max_json_depth
    may_hold_nul = b"\\u0000" in body
    if not (may_be_deep or may_hold_nul):
        return
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict | list):
            if len(path) >= limits.max_json_depth:
                raise InvalidRequestError(
                    f"The request body nests arrays and objects more than "
                    f"{limits.max_json_depth} levels deep (at '{param_path(path) or '$'}'); "
                    "flatten it (the limit is server.limits.max_json_depth).",
                    param=param_path(path[:1]) or None,
                    code="json_too_deep",
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((item, (*path, key)) for key, item in items)
        elif may_hold_nul and isinstance(value, str) and "\x00" in value:
            raise InvalidRequestError(
                f"Invalid value for '{param_path(path)}': NUL characters (\\u0000) are not allowed "
                "in text; remove them.",
                param=param_path(path) or None,
                code="invalid_characters",
            )


def check_request(parsed: ChatCompletionRequest | CompletionRequest, limits: RequestLimits) -> None:
    """The configurable bounds of a chat or completions request."""
    if isinstance(parsed, ChatCompletionRequest):
        _check_count("messages", len(parsed.messages), limits.max_messages, "max_messages")
        for index, message in enumerate(parsed.messages):
            _check_chars(f"messages[{index}].content", message.text, limits)
    else:
        prompts = parsed.prompts
        _check_count("prompt", len(prompts), limits.max_messages, "max_messages", noun="prompts")
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                _check_chars("prompt" if len(prompts) == 1 else f"prompt[{index}]", prompt, limits)
        if parsed.best_of is not None:
            _check_value("best_of", parsed.best_of, limits.max_n, "max_n")
    _check_value("n", parsed.n, limits.max_n, "max_n")
    if parsed.stop is not None:
        _check_count(
            "stop",
            len(parsed.stop),
            limits.max_stop_sequences,
            "max_stop_sequences",
            noun="stop sequences",
        )


def _check_count(param: str, count: int, limit: int, key: str, noun: str = "messages") -> None:
    if count > limit:
        raise InvalidRequestError(
            f"Invalid value for '{param}': at most {limit} {noun} are allowed per request, got "
            f"{count}; send fewer (the limit is server.limits.{key}).",
            param=param,
            code="too_many_items",
        )


def _check_value(param: str, value: int, limit: int, key: str) -> None:
    if value > limit:
        raise InvalidRequestError(
            f"Invalid value for '{param}': at most {limit} is allowed, got {value} "
            f"(the limit is server.limits.{key}).",
            param=param,
        )


def _check_chars(param: str, text: str, limits: RequestLimits) -> None:
    if len(text) > limits.max_message_chars:
        raise InvalidRequestError(
            f"Invalid value for '{param}': at most {limits.max_message_chars} characters are "
            f"allowed in one message, got {len(text)}; shorten it or split it across messages "
            "(the limit is server.limits.max_message_chars).",
            param=param,
            code="string_too_long",
        )
