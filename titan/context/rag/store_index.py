"""This process's vector index of the stores it searches, kept in step with the shared storage.

Chunks are documents (text, character span, float32 vector); the index is only a cache of
their vectors. Every change to a store's files bumps the store's ``revision``; before a search
the index compares the revision it last saw and, when another request or another replica changed
the store, loads the files it lacks and drops the ones that left. So a replica sees a file
another replica added on its next search (no lag beyond one storage read), a restart needs no
rebuild step, and nothing is embedded twice.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Awaitable, Callable, Sequence

from titan.cache.index import ScopedIndex
from titan.storage.base import DocumentStore

CHUNKS = "vector_store_chunks"


def pack(vector: Sequence[float]) -> str:
    # Little-endian float32 in base64: a quarter of a JSON list of floats, the same on any host.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def unpack(packed: str) -> tuple[float, ...]:
    raw = base64.b64decode(packed)
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def chunk_namespace(store_id: str, file_id: str) -> str:
    """One namespace per file of a store: a file's chunks load (and go) with one listing."""
    return f"{CHUNKS}:{store_id}:{file_id}"


def chunk_key(file_id: str, index: int) -> str:
    return f"{file_id}/{index:06d}"


def split_key(key: str) -> tuple[str, str]:
    """(file id, chunk id) of an index key."""
    file_id, _, chunk_id = key.partition("/")
    return file_id, chunk_id


class StoreIndex:
    def __init__(self, documents: DocumentStore):
        self.documents = documents
        self._index: ScopedIndex | None = None  # made with the first vector: it knows the size
        self._files: dict[str, dict[str, list[str]]] = {}  # store -> file -> index keys
        self._revisions: dict[str, int] = {}
        self._syncing = asyncio.Lock()

    def __len__(self) -> int:
        return 0 if self._index is None else len(self._index)

    async def follow(
        self,
        store_id: str,
        revision: int,
        completed_files: Callable[[], Awaitable[set[str]]],
    ) -> None:
        """Bring the store's vectors in line with storage at ``revision``: ``completed_files``
        lists the files whose chunks are all stored (read after the revision, so the state it
        describes is at least that new)."""
        if self._revisions.get(store_id) == revision:
            return
        async with self._syncing:
            if self._revisions.get(store_id) == revision:
                return
            wanted = await completed_files()
            held = self._files.setdefault(store_id, {})
            for file_id in set(held) - wanted:
                self._drop(store_id, file_id)
            for file_id in sorted(wanted - set(held)):
                await self._load(store_id, file_id)
            self._revisions[store_id] = revision

    async def _load(self, store_id: str, file_id: str) -> None:
        stored = await self.documents.list(chunk_namespace(store_id, file_id))
        keys = [f"{file_id}/{chunk_id}" for chunk_id, _ in stored]
        self._files[store_id][file_id] = keys
        if not keys:
            return
        vectors = [unpack(chunk["vector"]) for _, chunk in stored]
        if self._index is None:
            self._index = ScopedIndex(len(vectors[0]))
        self._index.add_many(store_id, keys, vectors)

    def _drop(self, store_id: str, file_id: str) -> None:
        for key in self._files[store_id].pop(file_id, []):
            if self._index is not None:
                self._index.remove(store_id, key)

    def forget(self, store_id: str) -> None:
        """The store is gone: free its vectors."""
        for file_id in list(self._files.get(store_id, {})):
            self._drop(store_id, file_id)
        self._files.pop(store_id, None)
        self._revisions.pop(store_id, None)

    async def prune(self, revisions: dict[str, int]) -> None:
        """Forgets each held store not at its revision in ``revisions`` (store id -> revision;
        absent: deleted). Under the sync lock: a store half loaded is not pulled from under it."""
        async with self._syncing:
            for store_id in list(self._files):
                if self._revisions.get(store_id) != revisions.get(store_id):
                    self.forget(store_id)

    def search(self, store_id: str, vector: Sequence[float], k: int) -> list[tuple[str, float]]:
        if self._index is None:
            return []
        return self._index.search(store_id, vector, k)

    def holds(self, store_id: str) -> bool:
        return any(self._files.get(store_id, {}).values())
