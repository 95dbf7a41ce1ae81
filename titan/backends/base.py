"""The one protocol every backend implements: embedded engine, OpenAI-compatible upstream, ..."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from titan.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
)


@runtime_checkable
class Backend(Protocol):
    """Serves one or more models.

    Errors are titan.errors exceptions. The ``*_stream`` methods are async generators: any error
    a request can be refused with (bad parameter, prompt too long, unknown feature) is raised
    before the first chunk, so that callers can still answer with a plain HTTP error. Closing a
    stream early (client disconnect) aborts the work behind it.
    """

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The model names this backend answers to (may be empty until it is started)."""
        ...

    @property
    def is_ready(self) -> bool: ...

    async def start(self) -> None:
        """Load and warm up; may take long (model load). Raises titan.errors.ModelLoadError."""
        ...

    async def shutdown(self) -> None: ...

    def model_card(self, model_id: str) -> ModelCard: ...

    def stats(self) -> dict[str, Any]:
        """Operational counters (JSON-ready): requests, tokens, KV cache use."""
        ...

    async def chat_completion(self, request: ChatCompletionRequest) -> ChatCompletion: ...

    def chat_completion_stream(
        self, request: ChatCompletionRequest
    ) -> AsyncIterator[ChatCompletionChunk]: ...

    async def completion(self, request: CompletionRequest) -> Completion: ...

    def completion_stream(self, request: CompletionRequest) -> AsyncIterator[Completion]: ...
