"""A client request as it travels from the HTTP layer through the pipeline to a backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from titan.protocol.chat import ChatCompletionRequest
from titan.protocol.completions import CompletionRequest

Endpoint = Literal["chat", "completion"]


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

    @property
    def is_stream(self) -> bool:
        return self.parsed.stream

    @property
    def model(self) -> str | None:
        return self.parsed.model
