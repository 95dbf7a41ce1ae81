"""An upstream's refusals as titan.errors: one mapping from an HTTP status, error body and headers
(or an error event inside a stream) to ``UpstreamError``.

The error bodies of the servers Titan fronts:

- OpenAI, vLLM, llama.cpp, Ollama's /v1, SGLang streams: ``{"error": {"message", "type",
  "param", "code"}}`` (vLLM and llama.cpp put the HTTP status in ``code``);
- vLLM (older) and SGLang: the same fields at the top level, with ``"object": "error"``;
- TGI: ``{"error": "message", "error_type": "validation"}``; Ollama's native API:
  ``{"error": "message"}``; FastAPI's default: ``{"detail": ...}``;
- proxies and crashes: plain text or HTML (kept, truncated).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

from titan.errors import UpstreamError

# Statuses after which another attempt (later, or on another deployment) may succeed.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
MAX_MESSAGE_CHARS = 500

# The OpenAI error type a 4xx gets when the upstream names none.
_DEFAULT_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
# TGI's error_type values, for its error events (which carry no status): its own HTTP mapping.
_TGI_STATUSES = {
    "overloaded": 429,
    "validation": 422,
    "template_error": 422,
    "tool_error": 422,
    "generation": 424,
    "incomplete_generation": 500,
}


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


@dataclass(frozen=True)
class ErrorDetails:
    """What an error body says, whatever its dialect."""

    message: str = ""
    error_type: str | None = None
    param: str | None = None
    code: str | None = None
    status: int | None = None  # an HTTP status found in the body (vLLM's and llama.cpp's code)


def error_from_response(
    status: int, body: bytes, headers: Mapping[str, str], *, now: float | None = None
) -> UpstreamError:
    """The error for a non-2xx answer: its status, message, Retry-After and retryability."""
    details = parse_error_body(body)
    retry_after = parse_retry_after(headers, now=now)
    if not 400 <= status < 600:  # a redirect or an odd status: a misconfigured base_url
        message = f"Unexpected HTTP {status} from the upstream"
        if details.message:
            message += f": {details.message}"
        return UpstreamError(message, status_code=502, is_retryable=True, retry_after=retry_after)
    return _upstream_error(status, details, retry_after)


def error_from_stream_event(payload: bytes, *, is_error_event: bool) -> UpstreamError | None:
    """The error an event of a stream reports, or None for an ordinary chunk.

    ``is_error_event``: the event was typed ``error`` (llama.cpp's ``error:`` line, ``event:
    error``), so its payload is the error itself even without an ``error`` key.
    """
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError:
        if not is_error_event:
            return None
        details = ErrorDetails(message=_truncate(payload.decode("utf-8", "replace").strip()))
    else:
        if not isinstance(document, dict):
            return None
        if not (is_error_event or document.get("error") or document.get("object") == "error"):
            return None
        details = _details_of(document)
    status = details.status or _TGI_STATUSES.get(details.error_type or "", 500)
    if not details.message:
        details = ErrorDetails(
            "The upstream reported an error in the stream",
            details.error_type,
            details.param,
            details.code,
            details.status,
        )
    return _upstream_error(status, details, retry_after=None)


def parse_error_body(body: bytes) -> ErrorDetails:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict):
        details = _details_of(document)
        if details.message or details.error_type:
            return details
    return ErrorDetails(message=_truncate(body.decode("utf-8", "replace").strip()))


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` (OpenAI's, preferred as the more precise) or
    ``Retry-After`` (seconds or an HTTP date); None when absent or unreadable."""
    lowered = {name.lower(): value for name, value in headers.items()}
    milliseconds = _non_negative(lowered.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # "-0000": email.utils leaves it naive; HTTP dates are GMT
        moment = moment.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, moment.timestamp() - current)


def _upstream_error(status: int, details: ErrorDetails, retry_after: float | None) -> UpstreamError:
    if 400 <= status < 500:
        # The client's own mistake stays informative: the upstream's words, type, param, code.
        return UpstreamError(
            details.message or f"HTTP {status} from the upstream",
            status_code=status,
            is_retryable=is_retryable_status(status),
            retry_after=retry_after,
            error_type=details.error_type or _DEFAULT_TYPES.get(status, "invalid_request_error"),
            param=details.param,
            code=details.code,
        )
    message = f"Upstream HTTP {status}"
    if details.message:
        message += f": {details.message}"
    return UpstreamError(message, status_code=status, is_retryable=True, retry_after=retry_after)


def _details_of(document: dict[str, Any]) -> ErrorDetails:
    error = document.get("error")
    if isinstance(error, dict):  # OpenAI's shape
        return _details_of_fields(error)
    if isinstance(error, str):  # TGI, Ollama's native API
        return ErrorDetails(message=_truncate(error), error_type=_str(document.get("error_type")))
    if document.get("object") == "error" or "message" in document:  # older vLLM, SGLang
        return _details_of_fields(document)
    detail = document.get("detail")  # FastAPI
    if isinstance(detail, str):
        return ErrorDetails(message=_truncate(detail))
    if isinstance(detail, list):  # request validation: [{"loc": [...], "msg": "..."}]
        messages = [str(item.get("msg")) for item in detail if isinstance(item, dict)]
        return ErrorDetails(message=_truncate("; ".join(messages)))
    return ErrorDetails()


def _details_of_fields(fields: dict[str, Any]) -> ErrorDetails:
    code = fields.get("code")
    status = code if type(code) is int and 400 <= code < 600 else None
    return ErrorDetails(
        message=_truncate(str(fields.get("message") or "")),
        error_type=_str(fields.get("type")),
        param=_str(fields.get("param")),
        code=_str(code),
        status=status,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _non_negative(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _truncate(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[: MAX_MESSAGE_CHARS - 1] + "…"
