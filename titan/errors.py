"""One exception tree for all of Titan.

Each class maps to exactly one OpenAI error body and HTTP status; the API layer does that mapping
in one place (``titan.api.errors``). Policy and engine code raise these, never HTTP exceptions.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TitanError(Exception):
    """Base class: ``status_code`` and ``error_type`` pick the HTTP status and OpenAI ``type``."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None
    # A 5xx that is an answer, not a failure (overload refusals, only-if-cached misses): the
    # HTTP layer does not log it as an error.
    is_expected: ClassVar[bool] = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def to_body(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(TitanError):
    """The request is malformed or names a bad parameter value (400)."""

    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    """The prompt (plus the requested completion) does not fit the model's context window."""

    default_code = "context_length_exceeded"


class AuthenticationError(TitanError):
    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class ModelNotFoundError(TitanError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"

    def __init__(self, model: str, available: list[str] | None = None):
        hint = f" Available models: {', '.join(available)}." if available else ""
        super().__init__(f"The model '{model}' does not exist.{hint}", param="model")


class NotFoundError(TitanError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class PreconditionFailedError(TitanError):
    """An ``If-Match`` precondition does not hold: the resource changed (or is absent) since the
    client read it (412)."""

    status_code = 412
    error_type = "invalid_request_error"
    default_code = "precondition_failed"


class PayloadTooLargeError(TitanError):
    """A value to store exceeds its size limit (413)."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class RateLimitError(TitanError):
    """Too many requests right now; ``retry_after`` (seconds) becomes a Retry-After header."""

    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float | None = None, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after
        # x-ratelimit-* headers of the limit that refused (OpenAI's names).
        self.headers: dict[str, str] = {}


class QuotaExceededError(RateLimitError):
    """A key's or tenant's budget is spent (429, OpenAI's ``insufficient_quota``)."""

    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


class PermissionDeniedError(TitanError):
    """The key is valid but not allowed to do this (a model outside its policy, admin routes)."""

    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class ServiceUnavailableError(TitanError):
    """Not ready yet (model loading) or shutting down (503)."""

    status_code = 503
    error_type = "service_unavailable"
    default_code = "service_unavailable"


class OverloadedError(ServiceUnavailableError):
    """Admission refused or dropped the request: the queue is full, or the request cannot be
    served within its deadline (503 with Retry-After)."""

    default_code = "overloaded"
    is_expected = True

    def __init__(self, message: str, *, retry_after: float | None = None, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after


class StorageUnavailableError(ServiceUnavailableError):
    """The shared storage (Redis) cannot be reached: 503 with Retry-After. Raised by the stores
    for connection errors and timeouts, so callers see this instead of a client library's
    exception; what each caller then does (fail open or closed) is its own policy."""

    default_code = "storage_unavailable"
    is_expected = True

    def __init__(self, message: str, *, retry_after: float | None = 1.0, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after


class NotCachedError(TitanError):
    """``only-if-cached`` and no cached answer: 504, as HTTP caches answer it."""

    status_code = 504
    error_type = "cache_miss"
    default_code = "not_cached"
    is_expected = True


class EngineError(TitanError):
    """The embedded engine failed while running a request (500)."""

    status_code = 500
    error_type = "server_error"
    default_code = "engine_error"


class ModelLoadError(TitanError):
    """A model file or directory could not be found or understood."""

    status_code = 500
    error_type = "server_error"
    default_code = "model_load_error"


class ConfigError(TitanError):
    """A configuration file or flag is invalid; the message names the key and the file."""

    status_code = 500
    error_type = "server_error"
    default_code = "config_error"


class UpstreamError(TitanError):
    """An upstream (an OpenAI-compatible server, a simulated backend) failed or refused.

    Carries the upstream's status, which the client gets when no retry or fallback rescues the
    request; ``is_retryable`` says whether another attempt (elsewhere) may succeed.
    """

    error_type = "upstream_error"
    default_code = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 502,
        is_retryable: bool = True,
        retry_after: float | None = None,
        error_type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message, param=param, code=code)
        self.status_code = status_code  # type: ignore[misc]  # per instance, not per class
        if error_type is not None:
            self.error_type = error_type  # type: ignore[misc]
        self.is_retryable = is_retryable
        self.retry_after = retry_after


class UpstreamTimeoutError(UpstreamError):
    """No first byte (or no answer) within the deployment's timeout; retryable (504)."""

    default_code = "upstream_timeout"

    def __init__(self, message: str):
        super().__init__(message, status_code=504, is_retryable=True, error_type="timeout")


class UpstreamConnectionError(UpstreamError):
    """The upstream could not be reached or dropped the connection; retryable (502)."""

    default_code = "upstream_unreachable"

    def __init__(self, message: str):
        super().__init__(message, status_code=502, is_retryable=True)


class NoHealthyDeploymentError(ServiceUnavailableError):
    """Every deployment of the model (and its fallbacks) is ejected or over capacity (503)."""

    default_code = "no_healthy_deployment"

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceededError(TitanError):
    """The request's total deadline passed before an answer (504)."""

    status_code = 504
    error_type = "timeout"
    default_code = "deadline_exceeded"


class StorageFullError(StorageUnavailableError):
    """The storage has no room left to write (SQLite's ``database or disk is full``, ENOSPC,
    Redis's OOM under ``noeviction``):
    503 with Retry-After, code ``storage_full``. A subclass of StorageUnavailableError, so the
    callers that fail open on an unreachable store (limits, the cache, usage) do the same here.
    Not ``is_expected``: an operator must free space, so the HTTP layer logs it as an error."""

    default_code = "storage_full"
    is_expected = False

    def __init__(self, message: str, *, retry_after: float | None = 30.0, code: str | None = None):
        super().__init__(message, retry_after=retry_after, code=code)


class ContentPolicyError(InvalidRequestError):
    """A guardrail policy blocked the request's input (400). The message names the policy and
    what kind of content it found, never the content itself."""

    default_code = "content_policy_violation"

    def __init__(self, policy: str, kinds: list[str], *, param: str | None = None):
        super().__init__(
            f"The request was blocked by the guardrail policy '{policy}' "
            f"({', '.join(kinds)} found in the input). Remove that content and retry.",
            param=param,
        )
        self.policy = policy
