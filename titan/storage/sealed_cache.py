"""Cached answers sealed at rest: a ``CacheStore`` wrapper over any store.

What is sealed: the answer (``value``), the embedding of the question (embeddings can be
inverted back to text), and every tag that is not a selector — the semantic cache's ``question``
tag holds the user's words. The selectors stay in clear because the stores act on them:
``tenant`` and ``model`` (``flush``), ``scope`` (a fingerprint the semantic index groups by).
Each field is bound to its namespace, key and field name, so a value copied to another entry
fails to open. Entries stored in clear before encryption was on read as they are.

A cached answer is disposable: one that cannot be opened (its key left the config, or it was
altered) is a miss, logged, and the next answer replaces it — not a 503 like a document.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import replace

import orjson

from titan.storage.base import CacheEntry, CacheStore
from titan.storage.sealed import BYTES_MAGIC, SEALED_FIELD, DataKeyError, Keyring

logger = logging.getLogger(__name__)

CLEAR_TAGS = frozenset({"tenant", "model", "scope"})


def _place(namespace: str, key: str, field: str) -> bytes:
    return f"cache:{len(namespace)}:{namespace}:{len(key)}:{key}:{field}".encode()


class SealedCache:
    def __init__(self, inner: CacheStore, keyring: Keyring):
        self.inner = inner
        self.keyring = keyring

    def _seal_bytes(self, data: bytes, place: bytes) -> bytes:
        return BYTES_MAGIC + self.keyring.seal(data, place)

    def _open_bytes(self, data: bytes, place: bytes) -> bytes:
        if not data.startswith(BYTES_MAGIC):
            return data  # stored before encryption was on
        return self.keyring.open(data[len(BYTES_MAGIC) :], place)

    def seal(self, namespace: str, entry: CacheEntry) -> CacheEntry:
        if not self.keyring.is_sealing:
            return entry
        key = entry.key
        tags = {k: v for k, v in entry.tags.items() if k in CLEAR_TAGS}
        secret_tags = {k: v for k, v in entry.tags.items() if k not in CLEAR_TAGS}
        if secret_tags:
            sealed = self.keyring.seal(orjson.dumps(secret_tags), _place(namespace, key, "tags"))
            tags[SEALED_FIELD] = base64.b64encode(sealed).decode()
        embedding = entry.embedding
        if embedding is not None:
            embedding = self._seal_bytes(embedding, _place(namespace, key, "embedding"))
        value = self._seal_bytes(entry.value, _place(namespace, key, "value"))
        return replace(entry, value=value, tags=tags, embedding=embedding)

    def open(self, namespace: str, entry: CacheEntry) -> CacheEntry:
        key = entry.key
        tags = dict(entry.tags)
        sealed_tags = tags.pop(SEALED_FIELD, None)
        if sealed_tags is not None:
            place = _place(namespace, key, "tags")
            tags.update(orjson.loads(self.keyring.open(base64.b64decode(sealed_tags), place)))
        embedding = entry.embedding
        if embedding is not None:
            embedding = self._open_bytes(embedding, _place(namespace, key, "embedding"))
        value = self._open_bytes(entry.value, _place(namespace, key, "value"))
        return replace(entry, value=value, tags=tags, embedding=embedding)

    def _opened(self, namespace: str, entry: CacheEntry) -> CacheEntry | None:
        try:
            return self.open(namespace, entry)
        except DataKeyError as exc:
            logger.warning("cached answer unreadable: a miss", extra={"reason": exc.message})
            return None

    async def get(self, namespace: str, key: str) -> CacheEntry | None:
        entry = await self.inner.get(namespace, key)
        return None if entry is None else self._opened(namespace, entry)

    async def put(self, namespace: str, entry: CacheEntry, *, max_entries: int) -> list[str]:
        return await self.inner.put(namespace, self.seal(namespace, entry), max_entries=max_entries)

    async def delete(self, namespace: str, key: str) -> bool:
        return await self.inner.delete(namespace, key)

    async def flush(
        self, namespace: str, *, tenant: str | None = None, model: str | None = None
    ) -> int:
        return await self.inner.flush(namespace, tenant=tenant, model=model)

    async def added_since(
        self, namespace: str, since: float, *, limit: int = 10_000
    ) -> list[CacheEntry]:
        entries = await self.inner.added_since(namespace, since, limit=limit)
        opened = (self._opened(namespace, entry) for entry in entries)
        return [entry for entry in opened if entry is not None]

    async def stats(self, namespace: str) -> dict[str, int]:
        return await self.inner.stats(namespace)
