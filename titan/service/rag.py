"""Files and vector stores behind the HTTP API: who the caller's tenant is, and one set of
vector stores per pipeline (its index lives in memory)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from titan.context.rag import MAX_FILE_BYTES, Files, FileTooLargeError, VectorStores
from titan.errors import ServiceUnavailableError
from titan.service.pipeline import Pipeline

__all__ = ["MAX_FILE_BYTES", "FileTooLargeError", "RagService"]


class RagService:
    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self._stores: VectorStores | None = None
        self._loading = asyncio.Lock()

    @classmethod
    def of(cls, pipeline: Pipeline) -> RagService:
        """The pipeline's one service (not one per request): it owns the vector index."""
        if pipeline.rag is None:
            pipeline.rag = cls(pipeline)
        return pipeline.rag  # type: ignore[no-any-return]

    async def tenant(self, api_key: str | None) -> str:
        """The key's tenant; "" (everyone's) while auth is off, as for usage."""
        gate = self.pipeline.gate
        if gate is None or self.pipeline.storage is None:
            raise ServiceUnavailableError("Titan is still starting; retry shortly.")
        return await gate.tenant_for(api_key)

    def files(self) -> Files:
        # Files need no model: uploading one does not wait for the embedder to load.
        if self._stores is not None:
            return self._stores.files
        return Files(self._documents(), time.time)

    async def stores(self) -> VectorStores:
        """Built on first use: loading the embedder takes seconds, and the index is rebuilt
        from the stored chunks once."""
        async with self._loading:
            if self._stores is None:
                embedder = await self.pipeline._embedder_loaded()
                stores = VectorStores(self._documents(), embedder, time.time)
                await stores.rebuild()
                self._stores = stores
        return self._stores

    def _documents(self) -> Any:
        if self.pipeline.storage is None:
            raise ServiceUnavailableError("Titan is still starting; retry shortly.")
        return self.pipeline.storage.documents
