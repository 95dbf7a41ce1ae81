"""Files and vector stores behind the HTTP API: who the caller's tenant is, and one set of
vector stores per pipeline (its index lives in memory)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from titan.cache.embedder import Embedder
from titan.context.rag import MAX_FILE_BYTES, Files, FileTooLargeError, VectorStores
from titan.context.rag.files import MAX_BATCH_FILE_BYTES
from titan.service.authentication import Authenticator
from titan.storage.base import DocumentStore

__all__ = ["MAX_BATCH_FILE_BYTES", "MAX_FILE_BYTES", "FileTooLargeError", "RagService"]


class RagService:
    """The pipeline's one service (not one per request): it owns the vector index and the files
    being embedded."""

    def __init__(
        self,
        auth: Authenticator,
        documents: DocumentStore,
        embedder: Callable[[], Awaitable[Embedder]],
    ):
        self.auth = auth
        self._documents = documents
        self._embedder = embedder  # loads the embedding model on first use
        self._stores: VectorStores | None = None

    async def tenant(self, api_key: str | None) -> str:
        """The key's tenant; "" (everyone's) while auth is off, as for usage."""
        return await self.auth.tenant_for(api_key)

    def files(self) -> Files:
        return self.stores().files

    def stores(self) -> VectorStores:
        """Made on first use, without the embedding model: that loads (seconds) when a file is
        first embedded or a store first searched."""
        if self._stores is None:
            self._stores = VectorStores(self._documents, self._embedder, time.time)
        return self._stores

    def served_stores(self) -> VectorStores | None:
        """The stores once made (None: no file or store served yet), for the retention sweep."""
        return self._stores

    async def delete_file(self, tenant: str, file_id: str) -> dict[str, Any]:
        """Deletes the file and takes it out of every vector store holding it."""
        stores = self.stores()
        await stores.files.get(tenant, file_id)
        await stores.forget_file(tenant, file_id)
        return await stores.files.delete(tenant, file_id)

    async def close(self) -> None:
        if self._stores is not None:
            await self._stores.close()
