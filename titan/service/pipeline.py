"""The request pipeline. For now: resolve the model name to a backend, then call it.

Later steps (authenticate, admit, context, cache, route, record) slot in around the backend call;
routes stay thin because everything between parsing and serializing happens here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from titan.backends import Backend, EmbeddedBackend
from titan.config import TitanConfig
from titan.errors import ModelNotFoundError, ServiceUnavailableError
from titan.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from titan.service.streaming import start_stream

logger = logging.getLogger(__name__)


class Pipeline:
    def __init__(self, backends: Sequence[Backend]):
        self._backends = tuple(backends)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def is_ready(self) -> bool:
        return all(backend.is_ready for backend in self._backends)

    async def start(self) -> None:
        """Start every backend (model loads happen here; this can take a while)."""
        await asyncio.gather(*(backend.start() for backend in self._backends))

    async def shutdown(self) -> None:
        for backend in self._backends:
            try:
                await backend.shutdown()
            except Exception:
                logger.exception("backend shutdown failed", extra={"backend": repr(backend)})

    # ---- models --------------------------------------------------------------------------

    def model_ids(self) -> list[str]:
        return [model_id for backend in self._backends for model_id in backend.model_ids]

    def list_models(self) -> ModelList:
        return ModelList(
            data=[
                backend.model_card(model_id)
                for backend in self._backends
                for model_id in backend.model_ids
            ]
        )

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each ready model's operational counters, by model id."""
        return {
            model_id: backend.stats()
            for backend in self._backends
            if backend.is_ready
            for model_id in backend.model_ids
        }

    def get_model(self, model_id: str) -> ModelCard:
        return self._backend_for(model_id).model_card(model_id)

    def _backend_for(self, model: str | None) -> Backend:
        for backend in self._backends:
            # No model named: the first served model, as vLLM does.
            if (model is None and backend.model_ids) or model in backend.model_ids:
                return backend
        if not self.is_ready:
            raise ServiceUnavailableError("The model is still loading; retry shortly.")
        raise ModelNotFoundError(model or "", self.model_ids())

    # ---- completions ---------------------------------------------------------------------

    async def chat_completion(self, request: ChatCompletionRequest) -> ChatCompletion:
        return await self._backend_for(request.model).chat_completion(request)

    async def chat_completion_stream(
        self, request: ChatCompletionRequest
    ) -> AsyncIterator[ChatCompletionChunk]:
        """A started stream: refusals raise here, before the first chunk is handed out."""
        backend = self._backend_for(request.model)
        return await start_stream(backend.chat_completion_stream(request))

    async def completion(self, request: CompletionRequest) -> Completion:
        return await self._backend_for(request.model).completion(request)

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[Completion]:
        backend = self._backend_for(request.model)
        return await start_stream(backend.completion_stream(request))


def build_pipeline(config: TitanConfig) -> Pipeline:
    """The pipeline a config describes: for now, the one embedded model."""
    return Pipeline([EmbeddedBackend(config.embedded)])
