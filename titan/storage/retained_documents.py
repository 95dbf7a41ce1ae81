"""Retention: documents of a kind are kept for a set time after their last write, then gone.

``RetainedDocuments`` wraps a ``DocumentStore``: every write stamps ``_written_at`` (the store's
wall clock, unix seconds), and a document of a retained namespace older than its retention reads
as absent (``get`` None, left out of ``list``) from that moment, whether or not it was purged yet:
expired data is never served. Purging is the sweep's job (``titan.context.retention_sweep``): Redis
keeps one hash per namespace (no per-field expiry before 7.4), and a vector store takes its files'
chunks with it, so expiry is a timestamp and a periodic sweep rather than a store TTL.

Namespaces without a retention pass straight through, and a document written before retention
was configured (no ``_written_at``) counts from when the sweep first sees it: it is stamped then,
so turning retention on never deletes old data at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from titan.storage.base import DocumentStore

WRITTEN_AT = "_written_at"


class RetainedDocuments:
    def __init__(
        self,
        inner: DocumentStore,
        retention_s: Mapping[str, float],
        now: Callable[[], float],
    ):
        self.inner = inner
        self.retention_s = dict(retention_s)  # namespace -> seconds
        self._now = now

    def _is_expired(self, namespace: str, doc: Mapping[str, Any]) -> bool:
        keep_s = self.retention_s.get(namespace)
        written_at = doc.get(WRITTEN_AT)
        if keep_s is None or not isinstance(written_at, int | float):
            return False
        return written_at + keep_s <= self._now()

    def _stamped(self, namespace: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        if namespace not in self.retention_s:
            return dict(doc)
        return {**doc, WRITTEN_AT: self._now()}

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None:
        await self.inner.put(namespace, doc_id, self._stamped(namespace, doc))

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        if expected is None and namespace in self.retention_s:
            # "Only if absent": an expired document is absent, though not purged yet.
            stored = await self.inner.get(namespace, doc_id)
            if stored is not None and self._is_expired(namespace, stored):
                await self.inner.delete(namespace, doc_id)
        return await self.inner.put_if(
            namespace, doc_id, self._stamped(namespace, doc), expected=expected
        )

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None:
        stored = await self.inner.get(namespace, doc_id)
        if stored is None or self._is_expired(namespace, stored):
            return None
        return _without_stamp(stored)

    async def delete(self, namespace: str, doc_id: str) -> bool:
        return await self.inner.delete(namespace, doc_id)

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (doc_id, _without_stamp(doc))
            for doc_id, doc in await self.inner.list(namespace)
            if not self._is_expired(namespace, doc)
        ]

    async def expired(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        """The namespace's expired documents (for the sweep to purge). Documents written before
        retention was on get their ``_written_at`` now (by compare-and-set where versioned, so a
        concurrent write is never overwritten)."""
        found = []
        for doc_id, doc in await self.inner.list(namespace):
            if WRITTEN_AT not in doc:
                await self._stamp_old(namespace, doc_id, doc)
            elif self._is_expired(namespace, doc):
                found.append((doc_id, _without_stamp(doc)))
        return found

    async def _stamp_old(self, namespace: str, doc_id: str, doc: dict[str, Any]) -> None:
        version = doc.get("_version")
        if isinstance(version, str):
            await self.inner.put_if(
                namespace, doc_id, self._stamped(namespace, doc), expected=version
            )
        else:
            await self.inner.put(namespace, doc_id, self._stamped(namespace, doc))


def _without_stamp(doc: dict[str, Any]) -> dict[str, Any]:
    doc.pop(WRITTEN_AT, None)
    return doc
