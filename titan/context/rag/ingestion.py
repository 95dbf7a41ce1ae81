"""Turning a file into a vector store's chunks: token windows, embedded in batches, stored.

Runs as a background task of the replica that accepted the file; it stamps a heartbeat on the
file's link after every batch, so a link whose replica died mid-file is seen as stale (and
reported failed) instead of "in_progress" forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from titan.context.rag.chunking import chunk_text
from titan.context.rag.store_index import chunk_namespace, pack
from titan.storage.base import DocumentStore

# Chunks per model call: large enough to batch well, small enough that other requests'
# embeddings (the semantic cache shares the model's thread) wait at most a second or so.
EMBED_BATCH = 64


class TextEmbedder(Protocol):
    """What a vector store needs of ``titan.cache.embedder.Embedder`` (blocking calls, run in
    a worker thread here)."""

    def encode(self, texts: list[str]) -> Sequence[Sequence[float]]: ...

    def token_offsets(self, text: str) -> list[tuple[int, int]]: ...


async def embed_file(
    documents: DocumentStore,
    embedder: TextEmbedder,
    store_id: str,
    file_id: str,
    filename: str,
    text: str,
    *,
    max_tokens: int,
    overlap: int,
    heartbeat: Callable[[], Awaitable[None]],
) -> tuple[int, int]:
    """Stores the file's chunks; returns (chunks, bytes used). On any failure, cancellation
    included, the chunks written so far are deleted: no half-indexed file."""
    offsets = await asyncio.to_thread(embedder.token_offsets, text)
    chunks = chunk_text(text, offsets, max_tokens=max_tokens, overlap=overlap)
    namespace = chunk_namespace(store_id, file_id)
    usage = 0
    try:
        for start in range(0, len(chunks), EMBED_BATCH):
            batch = chunks[start : start + EMBED_BATCH]
            vectors = await asyncio.to_thread(embedder.encode, [c.text for c in batch])
            for chunk, vector in zip(batch, vectors, strict=True):
                usage += len(chunk.text.encode()) + 4 * len(vector)
                document = {
                    "filename": filename,
                    "text": chunk.text,
                    "start": chunk.start,
                    "end": chunk.end,
                    "vector": pack(vector),
                }
                await documents.put(namespace, f"{chunk.index:06d}", document)
            await heartbeat()
    except BaseException:
        await asyncio.shield(drop_chunks(documents, store_id, file_id))
        raise
    return len(chunks), usage


async def drop_chunks(documents: DocumentStore, store_id: str, file_id: str) -> None:
    namespace = chunk_namespace(store_id, file_id)
    for chunk_id, _ in await documents.list(namespace):
        await documents.delete(namespace, chunk_id)
