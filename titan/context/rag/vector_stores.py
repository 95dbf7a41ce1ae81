"""Vector stores (OpenAI's Vector Stores API): files cut into token chunks, embedded, searched.

Chunks are documents (text, character span, float32 vector) so that a restart rebuilds the
in-memory index from storage (``rebuild``) without running the model again. The index has one
scope per vector store: a search never sees another store's chunks, and stores belong to one
tenant, so neither does another tenant's search.

Files are embedded while the request waits (OpenAI does it in the background and reports
"in_progress"): a 4 MiB file is about 1,500 chunks, tens of seconds on CPU, and every answer
then says "completed" or "failed" for good. The index lives in this process; replicas sharing a
storage see each other's files after a restart (``rebuild``).
"""

from __future__ import annotations

import asyncio
import base64
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from titan.cache.index import ScopedIndex
from titan.context.rag.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP, check_sizes, chunk_text
from titan.context.rag.files import Files, page, scoped_id
from titan.errors import InvalidRequestError, NotFoundError
from titan.storage.base import DocumentStore

STORES = "vector_stores"
LINKS = "vector_store_files"  # which files a store holds, and how their processing went
CHUNKS = "vector_store_chunks"
# Chunks per model call: large enough to batch well, small enough that other requests'
# embeddings (the semantic cache shares the model's thread) wait at most a second or so.
EMBED_BATCH = 64
MAX_RESULTS = 50  # OpenAI's bound on max_num_results


class TextEmbedder(Protocol):
    """What a vector store needs of ``titan.cache.embedder.Embedder`` (blocking calls, run in
    a worker thread here)."""

    def encode(self, texts: list[str]) -> Sequence[Sequence[float]]: ...

    def token_offsets(self, text: str) -> list[tuple[int, int]]: ...


def pack(vector: Sequence[float]) -> str:
    # Little-endian float32 in base64: a quarter of a JSON list of floats, the same on any host.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def unpack(packed: str) -> tuple[float, ...]:
    raw = base64.b64decode(packed)
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def _counts(**counts: int) -> dict[str, int]:
    counts = {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0, **counts}
    return {**counts, "total": sum(counts.values())}


def _strategy(asked: Any) -> tuple[int, int]:
    """OpenAI's ``chunking_strategy``: "auto" (our default) or "static" with token sizes."""
    if asked is None or (isinstance(asked, dict) and asked.get("type") == "auto"):
        return DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP
    static = asked.get("static") if isinstance(asked, dict) else None
    if asked.get("type") != "static" or not isinstance(static, dict):  # type: ignore[union-attr]
        raise InvalidRequestError(
            "chunking_strategy must be {'type': 'auto'} or {'type': 'static', 'static': "
            "{'max_chunk_size_tokens': N, 'chunk_overlap_tokens': M}}.",
            param="chunking_strategy",
        )
    max_tokens = static.get("max_chunk_size_tokens", DEFAULT_MAX_TOKENS)
    overlap = static.get("chunk_overlap_tokens", DEFAULT_OVERLAP)
    try:
        if not isinstance(max_tokens, int) or not isinstance(overlap, int):
            raise ValueError("token sizes must be integers")
        check_sizes(max_tokens, overlap)
    except ValueError as exc:
        raise InvalidRequestError(
            f"Invalid chunking_strategy: {exc}.", param="chunking_strategy"
        ) from None
    return max_tokens, overlap


class VectorStores:
    def __init__(
        self,
        documents: DocumentStore,
        embedder: TextEmbedder,
        now: Callable[[], float],
        files: Files | None = None,
    ):
        self.documents = documents
        self.embedder = embedder
        self.now = now
        self.files = files or Files(documents, now)
        self.index: ScopedIndex | None = None  # made with the first vector: it knows the size
        # Store documents are read, changed and written back (file counts, usage): one change at
        # a time in this process.
        self._lock = asyncio.Lock()

    def _index_many(self, scope: str, keys: list[str], vectors: list[Sequence[float]]) -> None:
        if not keys:
            return
        if self.index is None:
            self.index = ScopedIndex(len(vectors[0]))
        self.index.add_many(scope, keys, vectors)

    async def rebuild(self) -> int:
        """Index every stored chunk again (at start); returns how many."""
        by_store: dict[str, tuple[list[str], list[Sequence[float]]]] = {}
        for chunk_id, chunk in await self.documents.list(CHUNKS):
            keys, vectors = by_store.setdefault(chunk["vector_store_id"], ([], []))
            keys.append(chunk_id)
            vectors.append(unpack(chunk["vector"]))
        for store_id, (keys, vectors) in by_store.items():
            self._index_many(store_id, keys, vectors)
        return sum(len(keys) for keys, _ in by_store.values())

    # ---- stores ----------------------------------------------------------------------------

    async def create(
        self,
        tenant: str,
        *,
        name: str | None = None,
        file_ids: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        chunking_strategy: Any = None,
    ) -> dict[str, Any]:
        _strategy(chunking_strategy)  # refuse a bad one before creating anything
        for file_id in file_ids:  # every file must exist before the store does
            await self.files.get(tenant, file_id)
        now = int(self.now())
        store = {
            "id": f"vs_{uuid.uuid4().hex[:24]}",
            "object": "vector_store",
            "created_at": now,
            "name": name,
            "usage_bytes": 0,
            "file_counts": _counts(),
            "status": "completed",
            "last_active_at": now,
            "metadata": metadata or {},
            "expires_after": None,
            "expires_at": None,
        }
        await self.documents.put(
            STORES, scoped_id(tenant, store["id"]), {**store, "tenant": tenant}
        )
        for file_id in file_ids:
            await self.add_file(tenant, store["id"], file_id, chunking_strategy=chunking_strategy)
        return await self.get(tenant, store["id"])

    async def get(self, tenant: str, store_id: str) -> dict[str, Any]:
        stored = await self.documents.get(STORES, scoped_id(tenant, store_id))
        if stored is None:
            raise NotFoundError(f"No such vector store: '{store_id}'.", param="vector_store_id")
        stored.pop("tenant", None)
        return stored

    async def list(
        self, tenant: str, *, limit: int = 20, order: str = "desc", after: str | None = None
    ) -> dict[str, Any]:
        stores = [
            stored
            for _, stored in await self.documents.list(STORES)
            if stored.pop("tenant", None) == tenant
        ]
        return page(stores, limit=limit, order=order, after=after)

    async def delete(self, tenant: str, store_id: str) -> dict[str, Any]:
        await self.get(tenant, store_id)
        for link in await self._links(tenant, store_id):
            await self._drop_chunks(store_id, link["id"], link.get("chunk_count", 0))
            await self.documents.delete(LINKS, scoped_id(tenant, f"{store_id}/{link['id']}"))
        await self.documents.delete(STORES, scoped_id(tenant, store_id))
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    async def _update(self, tenant: str, store_id: str, usage: int, **counts: int) -> None:
        async with self._lock:
            stored = await self.documents.get(STORES, scoped_id(tenant, store_id))
            if stored is None:  # deleted meanwhile
                return
            for name, delta in counts.items():
                stored["file_counts"][name] += delta
                stored["file_counts"]["total"] += delta
            stored["usage_bytes"] += usage
            stored["last_active_at"] = int(self.now())
            await self.documents.put(STORES, scoped_id(tenant, store_id), stored)

    # ---- files in a store ------------------------------------------------------------------

    async def _links(self, tenant: str, store_id: str) -> list[dict[str, Any]]:
        return [
            link
            for _, link in await self.documents.list(LINKS)
            if link.get("tenant") == tenant and link["vector_store_id"] == store_id
        ]

    async def add_file(
        self, tenant: str, store_id: str, file_id: str, *, chunking_strategy: Any = None
    ) -> dict[str, Any]:
        max_tokens, overlap = _strategy(chunking_strategy)
        await self.get(tenant, store_id)
        link_id = scoped_id(tenant, f"{store_id}/{file_id}")
        existing = await self.documents.get(LINKS, link_id)
        if existing is not None:  # adding a file twice is a no-op, as at OpenAI
            return _public(existing)
        file = await self.files.get(tenant, file_id)
        text = await self.files.content(tenant, file_id)
        link: dict[str, Any] = {
            "id": file_id,
            "object": "vector_store.file",
            "usage_bytes": 0,
            "created_at": int(self.now()),
            "vector_store_id": store_id,
            "status": "completed",
            "last_error": None,
            "attributes": {},
            "chunking_strategy": {
                "type": "static",
                "static": {"max_chunk_size_tokens": max_tokens, "chunk_overlap_tokens": overlap},
            },
            "tenant": tenant,
            "chunk_count": 0,
        }
        try:
            count, usage = await self._embed_file(
                store_id, file_id, file["filename"], text, max_tokens, overlap
            )
            link.update(chunk_count=count, usage_bytes=usage)
        except Exception as exc:  # the store says which file failed; the request does not
            link.update(
                status="failed", last_error={"code": "server_error", "message": str(exc)[:500]}
            )
        await self.documents.put(LINKS, link_id, link)
        await self._update(tenant, store_id, link["usage_bytes"], **{link["status"]: 1})
        return _public(link)

    async def _embed_file(
        self, store_id: str, file_id: str, filename: str, text: str, max_tokens: int, overlap: int
    ) -> tuple[int, int]:
        offsets = await asyncio.to_thread(self.embedder.token_offsets, text)
        chunks = chunk_text(text, offsets, max_tokens=max_tokens, overlap=overlap)
        usage = 0
        try:
            for start in range(0, len(chunks), EMBED_BATCH):
                batch = chunks[start : start + EMBED_BATCH]
                vectors = await asyncio.to_thread(self.embedder.encode, [c.text for c in batch])
                keys = [_chunk_id(store_id, file_id, chunk.index) for chunk in batch]
                for key, chunk, vector in zip(keys, batch, vectors, strict=True):
                    usage += len(chunk.text.encode()) + 4 * len(vector)
                    await self.documents.put(
                        CHUNKS,
                        key,
                        {
                            "vector_store_id": store_id,
                            "file_id": file_id,
                            "filename": filename,
                            "text": chunk.text,
                            "start": chunk.start,
                            "end": chunk.end,
                            "vector": pack(vector),
                        },
                    )
                self._index_many(store_id, keys, list(vectors))
        except BaseException:  # no half-indexed file: its chunks go with the failure
            await self._drop_chunks(store_id, file_id, len(chunks))
            raise
        return len(chunks), usage

    async def _drop_chunks(self, store_id: str, file_id: str, count: int) -> None:
        for index in range(count):
            key = _chunk_id(store_id, file_id, index)
            if self.index is not None:
                self.index.remove(store_id, key)
            await self.documents.delete(CHUNKS, key)

    async def list_files(
        self,
        tenant: str,
        store_id: str,
        *,
        status: str | None = None,
        limit: int = 20,
        order: str = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        await self.get(tenant, store_id)
        links = [
            _public(link)
            for link in await self._links(tenant, store_id)
            if status in (None, link["status"])
        ]
        return page(links, limit=limit, order=order, after=after)

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        return _public(await self._link(tenant, store_id, file_id))

    async def _link(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        await self.get(tenant, store_id)
        link = await self.documents.get(LINKS, scoped_id(tenant, f"{store_id}/{file_id}"))
        if link is None:
            raise NotFoundError(
                f"No file '{file_id}' in vector store '{store_id}'.", param="file_id"
            )
        return link

    async def remove_file(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        """Takes the file out of the store (its chunks too); the file itself stays."""
        link = await self._link(tenant, store_id, file_id)
        await self._drop_chunks(store_id, file_id, link.get("chunk_count", 0))
        await self.documents.delete(LINKS, scoped_id(tenant, f"{store_id}/{file_id}"))
        await self._update(tenant, store_id, -link["usage_bytes"], **{link["status"]: -1})
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    # ---- search ----------------------------------------------------------------------------

    async def search(
        self, tenant: str, store_id: str, query: Any, max_num_results: Any = 10
    ) -> dict[str, Any]:
        await self.get(tenant, store_id)
        if isinstance(query, list) and query and all(isinstance(q, str) for q in query):
            query = "\n".join(query)  # OpenAI takes several queries; one embedding for all
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequestError("'query' must be a non-empty string.", param="query")
        is_int = isinstance(max_num_results, int) and not isinstance(max_num_results, bool)
        if not is_int or not 1 <= max_num_results <= MAX_RESULTS:
            raise InvalidRequestError(
                f"'max_num_results' must be an integer between 1 and {MAX_RESULTS}.",
                param="max_num_results",
            )
        results = []
        if self.index is not None:
            (vector,) = await asyncio.to_thread(self.embedder.encode, [query])
            for chunk_id, score in self.index.search(store_id, vector, max_num_results):
                chunk = await self.documents.get(CHUNKS, chunk_id)
                if chunk is None:  # removed since the index was read
                    continue
                results.append(
                    {
                        "file_id": chunk["file_id"],
                        "filename": chunk["filename"],
                        "score": max(0.0, min(1.0, score)),
                        "attributes": {},
                        "content": [{"type": "text", "text": chunk["text"]}],
                    }
                )
        return {
            "object": "vector_store.search_results.page",
            "search_query": [query],
            "data": results,
            "has_more": False,
            "next_page": None,
        }


def _chunk_id(store_id: str, file_id: str, index: int) -> str:
    return f"{store_id}/{file_id}/{index:06d}"


def _public(link: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in link.items() if k not in ("tenant", "chunk_count")}
