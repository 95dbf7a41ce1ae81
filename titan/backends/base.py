"""The one protocol every backend implements: embedded engine, OpenAI-compatible upstream,
simulated backend. One backend instance serves one *deployment* of a model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from titan.protocol import Answer, ClientRequest, ModelCard


@runtime_checkable
class Backend(Protocol):
    """Serves one deployment.

    Errors are titan.errors exceptions; an upstream's failures are UpstreamError (with its status,
    Retry-After and whether another attempt may succeed). ``stream`` is an async generator that
    raises every refusal before its first chunk, so that callers can still retry, fail over, or
    answer with a plain HTTP error. Closing a stream early (client disconnect, a hedge that lost)
    aborts the work behind it.
    """

    @property
    def name(self) -> str:
        """The deployment's name (response header x-titan-deployment, metrics)."""
        ...

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The model names this deployment answers to (may be empty until it is started)."""
        ...

    @property
    def is_ready(self) -> bool: ...

    async def start(self) -> None:
        """Load, connect, warm up; may take long (model load). Raises titan.errors errors."""
        ...

    async def shutdown(self) -> None: ...

    def model_card(self, model_id: str) -> ModelCard: ...

    def stats(self) -> dict[str, Any]:
        """Operational counters (JSON-ready)."""
        ...

    async def probe(self) -> None:
        """An active health check: returns when healthy, raises UpstreamError otherwise."""
        ...

    async def complete(self, request: ClientRequest) -> Answer:
        """The whole answer of a non-streaming request."""
        ...

    def stream(self, request: ClientRequest) -> AsyncIterator[Answer]:
        """The chunks of a streaming request (``data:`` payloads, without [DONE])."""
        ...
