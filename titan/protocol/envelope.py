"""A client request as it travels from the HTTP layer through the pipeline to a backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from titan.protocol.chat import ChatCompletionRequest
from titan.protocol.common import StreamOptions
from titan.protocol.completions import CompletionRequest

Endpoint = Literal["chat", "completion"]


@dataclass(frozen=True)
class ClientContext:
    """Who sent a request and how its headers steer Titan (see ClientRequest's fields of the
    same names): what the HTTP layer reads from a request besides its body."""

    headers: Mapping[str, str] = field(default_factory=dict)
    api_key: str | None = field(default=None, repr=False)
    client_host: str | None = None
    timeout_s: float | None = None
    deadline_s: float | None = None


@dataclass(frozen=True)
class ClientRequest:
    """``parsed`` is the validated request; ``body`` is the client's JSON object exactly as
    received, unknown fields included, so that a passthrough backend forwards what Titan does not
    know (tools, response_format, vendor extras)."""

    endpoint: Endpoint
    parsed: ChatCompletionRequest | CompletionRequest
    body: Mapping[str, Any]
    request_id: str
    # Headers that steer routing and deadlines (x-titan-session, x-titan-timeout, ...),
    # lower-cased names.
    headers: Mapping[str, str] = field(default_factory=dict)
    # The API key the client presented (Authorization: Bearer, or api-key / x-api-key), if any,
    # and the client's address (limits for requests without a key).
    api_key: str | None = field(default=None, repr=False)
    client_host: str | None = None
    # Work a key submitted earlier (a job) runs as that key, named by id: the secret is never
    # stored with the job.
    key_id: str | None = None
    # x-titan-timeout: seconds for the whole request (None: server.request_timeout_s), and
    # x-titan-deadline: seconds within which the answer is still useful, which admission
    # plans against (None: admission.default_deadline_s). Parsed once, by the HTTP layer.
    timeout_s: float | None = None
    deadline_s: float | None = None
    # The server-side conversation this request continues (tenant-qualified), set by
    # /v1/responses: an embedded engine may reuse the KV of the conversation's last turn when
    # trimming dropped turns in between (context shift). Never sent upstream.
    shift_scope: str | None = None

    @classmethod
    def sent(
        cls,
        context: ClientContext,
        endpoint: Endpoint,
        parsed: ChatCompletionRequest | CompletionRequest,
        body: Mapping[str, Any],
        request_id: str,
    ) -> ClientRequest:
        """The request as ``context``'s client sent it."""
        return cls(
            endpoint, parsed, body, request_id, context.headers, context.api_key,
            context.client_host, timeout_s=context.timeout_s, deadline_s=context.deadline_s,
        )  # fmt: skip

    @property
    def max_output_tokens(self) -> int | None:
        parsed = self.parsed
        if isinstance(parsed, ChatCompletionRequest):
            return parsed.max_output_tokens
        return parsed.max_tokens

    def with_stream_usage(self) -> ClientRequest:
        """The same stream request asking for the final usage chunk (to cache it with the
        answer); the client's own choice stays readable in ``self.parsed.include_usage``."""
        if self.parsed.include_usage:
            return self
        body = {**self.body, "stream_options": {"include_usage": True}}
        options = StreamOptions(include_usage=True)
        return replace(
            self, parsed=self.parsed.model_copy(update={"stream_options": options}), body=body
        )

    def with_max_output_tokens(self, cap: int) -> ClientRequest:
        """The same request with its output capped at ``cap`` tokens (graceful degradation)."""
        current = self.max_output_tokens
        if current is not None and current <= cap:
            return self
        body = dict(self.body)
        if isinstance(self.parsed, ChatCompletionRequest):
            body.pop("max_completion_tokens", None)
            parsed = self.parsed.model_copy(
                update={"max_tokens": cap, "max_completion_tokens": None}
            )
        else:
            parsed = self.parsed.model_copy(update={"max_tokens": cap})
        body["max_tokens"] = cap
        return replace(self, parsed=parsed, body=body)

    @property
    def is_stream(self) -> bool:
        return self.parsed.stream

    @property
    def model(self) -> str | None:
        return self.parsed.model
