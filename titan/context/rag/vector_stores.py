"""Vector stores (OpenAI's Vector Stores API): files cut into token chunks, embedded, searched.

A store is a document; each file in it is a link document (its status, usage, chunking) and its
chunks are documents too (``ingestion``), so every replica sharing the storage serves the same
stores, and each one's in-memory index follows them (``store_index``). Stores belong to one
tenant: a search never sees another store's chunks, so never another tenant's.

Adding a file embeds it in a background task and waits up to ``wait_s`` for it: a small file
answers "completed" at once, a large one "in_progress", to be polled as at OpenAI (the SDK's
``create_and_poll`` does), and a client that hangs up does not stop it. A store document changes
by compare-and-set, so file counts stay exact when replicas change one store at once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from titan.context.rag.chunking import parse_chunking_strategy
from titan.context.rag.files import Files, page, scoped_id
from titan.context.rag.ingestion import TextEmbedder, drop_chunks, embed_file
from titan.context.rag.ranking import ranking_options, rerank
from titan.context.rag.store_index import StoreIndex, chunk_namespace, split_key
from titan.errors import InvalidRequestError, NotFoundError
from titan.storage.base import DocumentStore

STORES = "vector_stores"
LINKS = "vector_store_files"  # one namespace per store: its files and how processing went
MAX_RESULTS = 50  # OpenAI's bound on max_num_results
DEFAULT_WAIT_S = 10.0
# A file "in_progress" without a heartbeat for this long lost its replica: it is failed.
STALE_S = 120.0
_HIDDEN = ("tenant", "chunk_count", "heartbeat_at", "_version", "revision")


class _Removed(Exception):
    """The file left the store (or the store went) while it was being embedded."""


def _counts(**counts: int) -> dict[str, int]:
    counts = {"in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0, **counts}
    return {**counts, "total": sum(counts.values())}


def _version() -> str:
    return uuid.uuid4().hex


def _public(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k not in _HIDDEN}


def _links(store_id: str) -> str:
    return f"{LINKS}:{store_id}"


class VectorStores:
    def __init__(
        self,
        documents: DocumentStore,
        embedder: Callable[[], Awaitable[TextEmbedder]],
        now: Callable[[], float],
        files: Files | None = None,
        *,
        wait_s: float = DEFAULT_WAIT_S,
    ):
        self.documents = documents
        self.embedder = embedder  # loads the model on first use (seconds)
        self.now = now
        self.files = files or Files(documents, now)
        self.index = StoreIndex(documents)
        self.wait_s = wait_s
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Stops files being embedded (they read as failed once stale)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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
        parse_chunking_strategy(chunking_strategy)  # refuse a bad one before creating anything
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
        stored = {**store, "tenant": tenant, "revision": 0, "_version": _version()}
        await self.documents.put(STORES, scoped_id(tenant, store["id"]), stored)
        started = [
            task
            for file_id in file_ids
            if (task := await self._start(tenant, store["id"], file_id, chunking_strategy))
        ]
        if started:
            await asyncio.wait(started, timeout=self.wait_s)
        return await self.get(tenant, store["id"])

    async def _stored(self, tenant: str, store_id: str) -> dict[str, Any]:
        stored = await self.documents.get(STORES, scoped_id(tenant, store_id))
        if stored is None:
            raise NotFoundError(f"No such vector store: '{store_id}'.", param="vector_store_id")
        return stored

    async def get(self, tenant: str, store_id: str) -> dict[str, Any]:
        return _public(await self._stored(tenant, store_id))

    async def list(
        self, tenant: str, *, limit: int = 20, order: str = "desc", after: str | None = None
    ) -> dict[str, Any]:
        stores = [
            _public(stored)
            for _, stored in await self.documents.list(STORES)
            if stored.get("tenant") == tenant
        ]
        return page(stores, limit=limit, order=order, after=after)

    async def delete(self, tenant: str, store_id: str) -> dict[str, Any]:
        await self.get(tenant, store_id)
        await self.purge(tenant, store_id)
        return {"id": store_id, "object": "vector_store.deleted", "deleted": True}

    async def purge(self, tenant: str, store_id: str) -> None:
        """Removes the store with its files' links and chunks (a delete, or its retention
        ended). The store document goes last, so a purge cut short is found and finished by
        the next delete or sweep. Other replicas answer 404 for the store once its document is
        gone, and drop its vectors at their next sweep (``prune_index``)."""
        for file_id, _ in await self.documents.list(_links(store_id)):
            await self.documents.delete(_links(store_id), file_id)
            await drop_chunks(self.documents, store_id, file_id)
        await self.documents.delete(STORES, scoped_id(tenant, store_id))
        self.index.forget(store_id)

    async def prune_index(self) -> None:
        """Frees the vectors this replica holds of stores deleted or changed elsewhere (another
        replica's delete, an expiry): a deleted store's vectors do not outlive it in memory. A
        changed store reloads from storage at its next search."""
        revisions = {stored["id"]: stored["revision"] for _, stored in
                     await self.documents.list(STORES)}  # fmt: skip
        await self.index.prune(revisions)

    async def _update(self, tenant: str, store_id: str, usage: int, **counts: int) -> None:
        """Adds to the store's file counts and usage and bumps its revision, by compare-and-set
        (another replica may change the same store)."""
        while True:
            stored = await self.documents.get(STORES, scoped_id(tenant, store_id))
            if stored is None:  # deleted meanwhile
                return
            expected = stored["_version"]
            for name, delta in counts.items():
                stored["file_counts"][name] += delta
                stored["file_counts"]["total"] += delta
            stored["usage_bytes"] += usage
            stored["last_active_at"] = int(self.now())
            busy = stored["file_counts"]["in_progress"]
            stored["status"] = "in_progress" if busy else "completed"
            stored["revision"] += 1
            stored["_version"] = _version()
            key = scoped_id(tenant, store_id)
            if await self.documents.put_if(STORES, key, stored, expected=expected):
                return

    # ---- files in a store ------------------------------------------------------------------

    async def add_file(
        self, tenant: str, store_id: str, file_id: str, *, chunking_strategy: Any = None
    ) -> dict[str, Any]:
        task = await self._start(tenant, store_id, file_id, chunking_strategy)
        if task is not None:  # waiting does not cancel it: a client gone mid-file loses nothing
            await asyncio.wait({task}, timeout=self.wait_s)
        return await self.get_file(tenant, store_id, file_id)

    async def _start(
        self, tenant: str, store_id: str, file_id: str, chunking_strategy: Any
    ) -> asyncio.Task[None] | None:
        """Links the file to the store and starts embedding it; None when it was already there
        (adding a file twice is a no-op, as at OpenAI; a failed file is tried again)."""
        max_tokens, overlap = parse_chunking_strategy(chunking_strategy)
        await self.get(tenant, store_id)
        linked = await self.documents.get(_links(store_id), file_id)
        existing = await self._settled(store_id, linked)
        if existing is not None and existing["status"] != "failed":
            return None
        if existing is not None:
            await self.remove_file(tenant, store_id, file_id)
        file = await self.files.get(tenant, file_id)
        text = await self.files.content(tenant, file_id)
        link: dict[str, Any] = {
            "id": file_id,
            "object": "vector_store.file",
            "usage_bytes": 0,
            "created_at": int(self.now()),
            "vector_store_id": store_id,
            "status": "in_progress",
            "last_error": None,
            "attributes": {},
            "chunking_strategy": {
                "type": "static",
                "static": {"max_chunk_size_tokens": max_tokens, "chunk_overlap_tokens": overlap},
            },
            "tenant": tenant,
            "chunk_count": 0,
            "heartbeat_at": self.now(),
            "_version": _version(),
        }
        if not await self.documents.put_if(_links(store_id), file_id, link, expected=None):
            return None  # a concurrent request linked it first
        await self._update(tenant, store_id, 0, in_progress=1)
        task = asyncio.create_task(self._ingest(tenant, link, file["filename"], text))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _ingest(self, tenant: str, link: dict[str, Any], filename: str, text: str) -> None:
        store_id, file_id = link["vector_store_id"], link["id"]
        static = link["chunking_strategy"]["static"]
        current = link

        async def heartbeat() -> None:
            nonlocal current
            beat = {**current, "heartbeat_at": self.now(), "_version": _version()}
            written = await self.documents.put_if(
                _links(store_id), file_id, beat, expected=current["_version"]
            )
            if not written:
                raise _Removed
            current = beat

        try:
            count, usage = await embed_file(
                self.documents, await self.embedder(), store_id, file_id, filename, text,
                max_tokens=static["max_chunk_size_tokens"],
                overlap=static["chunk_overlap_tokens"], heartbeat=heartbeat,
            )  # fmt: skip
            done = {**current, "status": "completed", "chunk_count": count, "usage_bytes": usage}
        except _Removed:
            return
        except Exception as exc:  # the store says which file failed and why
            error = {"code": "server_error", "message": str(exc)[:500] or type(exc).__name__}
            done = {**current, "status": "failed", "last_error": error}
        done["_version"] = _version()
        if not await self.documents.put_if(
            _links(store_id), file_id, done, expected=current["_version"]
        ):  # removed after its last batch
            await drop_chunks(self.documents, store_id, file_id)
            return
        counts = {"in_progress": -1, done["status"]: 1}
        await self._update(tenant, store_id, done["usage_bytes"], **counts)

    async def _settled(self, store_id: str, link: dict[str, Any] | None) -> dict[str, Any] | None:
        """The link, marked failed when the replica embedding it stopped beating."""
        stale = link is not None and link["status"] == "in_progress"
        if not stale or self.now() - link["heartbeat_at"] < STALE_S:  # type: ignore[index]
            return link
        error = {"code": "server_error", "message": "Processing stopped (the server embedding "
                 "this file went away); add the file to the store again."}  # fmt: skip
        failed = {**link, "status": "failed", "last_error": error, "_version": _version()}
        if await self.documents.put_if(
            _links(store_id),
            link["id"],
            failed,
            expected=link["_version"],  # type: ignore[index]
        ):
            await drop_chunks(self.documents, store_id, link["id"])  # type: ignore[index]
            await self._update(failed["tenant"], store_id, 0, in_progress=-1, failed=1)
            return failed
        return await self.documents.get(_links(store_id), link["id"])  # type: ignore[index]

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
        links = []
        for _, link in await self.documents.list(_links(store_id)):
            settled = await self._settled(store_id, link)
            if settled is not None and status in (None, settled["status"]):
                links.append(_public(settled))
        return page(links, limit=limit, order=order, after=after)

    async def get_file(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        return _public(await self._link(tenant, store_id, file_id))

    async def _link(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        await self.get(tenant, store_id)
        link = await self._settled(store_id, await self.documents.get(_links(store_id), file_id))
        if link is None:
            raise NotFoundError(
                f"No file '{file_id}' in vector store '{store_id}'.", param="file_id"
            )
        return link

    async def remove_file(self, tenant: str, store_id: str, file_id: str) -> dict[str, Any]:
        """Takes the file out of the store (its chunks too; one being embedded stops); the file
        itself stays."""
        link = await self._link(tenant, store_id, file_id)
        if await self.documents.delete(_links(store_id), file_id):
            await drop_chunks(self.documents, store_id, file_id)
            await self._update(tenant, store_id, -link["usage_bytes"], **{link["status"]: -1})
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    async def forget_file(self, tenant: str, file_id: str) -> None:
        """A deleted file leaves every store of its tenant that holds it."""
        for _, stored in await self.documents.list(STORES):
            if stored.get("tenant") != tenant:
                continue
            if await self.documents.get(_links(stored["id"]), file_id) is not None:
                await self.remove_file(tenant, stored["id"], file_id)

    async def _completed(self, store_id: str) -> set[str]:
        links = await self.documents.list(_links(store_id))
        return {file_id for file_id, link in links if link["status"] == "completed"}

    # ---- search ----------------------------------------------------------------------------

    async def search(
        self,
        tenant: str,
        store_id: str,
        query: Any,
        max_num_results: Any = 10,
        ranking: Any = None,
    ) -> dict[str, Any]:
        stored = await self._stored(tenant, store_id)
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
        options = ranking_options(ranking)
        await self.index.follow(store_id, stored["revision"], lambda: self._completed(store_id))
        results = []
        if self.index.holds(store_id):
            embedder = await self.embedder()
            (vector,) = await asyncio.to_thread(embedder.encode, [query])
            hits = []
            wanted = options.candidates(max_num_results)
            for key, cosine in self.index.search(store_id, vector, wanted):
                file_id, chunk_id = split_key(key)
                chunk = await self.documents.get(chunk_namespace(store_id, file_id), chunk_id)
                if chunk is not None:  # else removed since the index was read
                    hits.append((file_id, chunk, cosine))
            texts = [chunk["text"] for _, chunk, _ in hits]
            cosines = [cosine for _, _, cosine in hits]
            scores = rerank(query, texts, cosines) if options.rerank else cosines
            ranked = sorted(zip(scores, hits, strict=True), key=lambda pair: -pair[0])
            for score, (file_id, chunk, _) in ranked[:max_num_results]:
                score = max(0.0, min(1.0, score))
                if score >= options.score_threshold:
                    results.append({
                        "file_id": file_id,
                        "filename": chunk["filename"],
                        "score": score,
                        "attributes": {},
                        "content": [{"type": "text", "text": chunk["text"]}],
                    })  # fmt: skip
        return {
            "object": "vector_store.search_results.page",
            "search_query": [query],
            "data": results,
            "has_more": False,
            "next_page": None,
        }
