"""What makes two requests the same for the cache: fingerprints and cache directives.

The exact key covers the tenant, the model, the normalized messages (or prompt) and every body
field that can change the output; fields that cannot (stream, stream_options, user, metadata,
the cache directives themselves) and parameters left at their documented defaults are left out,
so ``temperature: 1`` and no temperature are the same request.

The semantic scope covers the same minus the last user message (the question, compared by
meaning): a follow-up in another conversation, or under another system prompt, never matches.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from titan.config.cache import CacheDirective
from titan.errors import InvalidRequestError

# Body fields that do not change what the model answers.
_IGNORED_FIELDS = frozenset(
    {"model", "messages", "prompt", "stream", "stream_options", "user", "metadata", "store",
     "cache", "service_tier", "parallel_tool_calls_hint"}
)  # fmt: skip
# OpenAI's documented defaults: giving them is the same as leaving them out.
_DEFAULTS: dict[str, Any] = {
    "temperature": 1,
    "top_p": 1,
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "stop": None,
    "seed": None,
    "echo": False,
}
DIRECTIVES: tuple[CacheDirective, ...] = ("no-store", "no-cache", "only-if-cached")


def normalize_text(text: str) -> str:
    """NFC, one newline convention, no surrounding whitespace: invisible differences only."""
    return unicodedata.normalize("NFC", text.replace("\r\n", "\n")).strip()


def content_text(content: Any) -> str:
    """A message's text: a string, or the text of its content parts (others by their JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return normalize_text(content)
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(normalize_text(str(part.get("text", ""))))
            else:
                parts.append(_canonical(part).decode())
        return "\n".join(parts)
    return _canonical(content).decode()


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    normalized = {k: v for k, v in message.items() if k != "content" and v is not None}
    normalized["content"] = content_text(message.get("content"))
    return normalized


def output_parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's fields that can change the output, defaults dropped, max_tokens unified."""
    params = {k: v for k, v in body.items() if k not in _IGNORED_FIELDS}
    if "max_completion_tokens" in params:  # the newer name of the same limit
        params["max_tokens"] = params.pop("max_completion_tokens")
    return {k: v for k, v in params.items() if not (k in _DEFAULTS and v == _DEFAULTS[k])}


def _digest(*parts: Any) -> str:
    return hashlib.sha256(_canonical(list(parts))).hexdigest()


@dataclass(frozen=True)
class RequestKeys:
    """The exact key; for chat requests with a user question, the semantic scope and the
    question (the last user message)."""

    exact: str
    scope: str | None
    question: str | None


def request_keys(
    tenant: str | None, model: str, endpoint: str, body: Mapping[str, Any]
) -> RequestKeys:
    params = output_parameters(body)
    if endpoint == "chat":
        messages = [_message(m) for m in body.get("messages", []) if isinstance(m, Mapping)]
        exact = _digest("chat", tenant, model, messages, params)
        if messages and messages[-1].get("role") == "user" and messages[-1]["content"]:
            context = messages[:-1]
            scope = _digest("scope", tenant, model, context, params)
            return RequestKeys(exact, scope, messages[-1]["content"])
        return RequestKeys(exact, None, None)
    prompt = body.get("prompt")
    prompt = normalize_text(prompt) if isinstance(prompt, str) else prompt
    return RequestKeys(_digest("completion", tenant, model, prompt, params), None, None)


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """Temperature 0 (greedy) or a fixed seed: the same request gives the same answer."""
    temperature = body.get("temperature", _DEFAULTS["temperature"])
    return temperature == 0 or body.get("seed") is not None


def parse_directives(header: str | None, body_field: Any) -> frozenset[CacheDirective]:
    """``x-titan-cache: no-cache, no-store`` and the body's ``cache`` field: a directive, a list
    of them, or LiteLLM's ``{"no-cache": true, "no-store": true}``."""
    found: list[str] = []
    if header:
        found += [part.strip().lower() for part in header.split(",") if part.strip()]
    if isinstance(body_field, str):
        found.append(body_field.strip().lower())
    elif isinstance(body_field, list):
        found += [str(item).strip().lower() for item in body_field]
    elif isinstance(body_field, Mapping):
        found += [str(name).lower() for name, is_on in body_field.items() if is_on is True]
    elif body_field is not None:
        raise InvalidRequestError(
            "Invalid 'cache': give a directive (no-store, no-cache, only-if-cached), a list of "
            'them, or {"no-cache": true}.',
            param="cache",
        )
    return _checked(found)


def _checked(names: Iterable[str]) -> frozenset[CacheDirective]:
    directives = set()
    for name in names:
        if name not in DIRECTIVES:
            raise InvalidRequestError(
                f"Unknown cache directive {name!r}: use no-store, no-cache or only-if-cached "
                "(in the x-titan-cache header or the body's 'cache' field).",
                param="cache",
            )
        directives.add(name)
    return frozenset(directives)  # type: ignore[arg-type]
