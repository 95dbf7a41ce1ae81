"""The retention sweep: purges expired tenant data, and frees vectors of stores gone elsewhere.

Every replica runs one (``start``), every ``interval_s``. Expired documents already read as
absent (``titan.storage.retained_documents``); the sweep deletes them, with what hangs off them:

- a vector store: its file links and chunks (``VectorStores.purge``);
- a file: its content, and its chunks in every vector store of its tenant that holds it, as a
  delete does;
- anything else (stored responses, agent state, batches): the document.

Then it prunes this replica's vector index of stores deleted or changed by other replicas, so a
deleted store's vectors do not stay in memory until a restart. Sweeps of several replicas may
overlap: each step is a delete, harmless twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from titan.context.rag.files import CONTENTS, FILES, scoped_id
from titan.context.rag.vector_stores import STORES, VectorStores
from titan.storage.base import Storage
from titan.storage.outage_log import OutageLog

logger = logging.getLogger(__name__)


async def _no_embedder() -> Any:
    raise RuntimeError("the retention sweep embeds nothing")


class RetentionSweeper:
    def __init__(
        self,
        storage: Storage,
        vector_stores: Callable[[], VectorStores | None],
        *,
        interval_s: float,
        now: Callable[[], float],
    ):
        self.storage = storage
        self._vector_stores = vector_stores  # the server's, whose index lives in memory
        self.interval_s = interval_s
        self._now = now
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        sweeps = OutageLog("retention sweep", logger)
        while True:
            await asyncio.sleep(sweeps.backoff_s(self.interval_s, max_s=max(self.interval_s, 600)))
            try:
                await self.sweep()
            except Exception as exc:  # storage down, a key missing: the next round tries again
                sweeps.failed(exc)
            else:
                sweeps.succeeded()

    def _stores(self) -> VectorStores:
        stores = self._vector_stores()
        if stores is None:  # no file or store served yet: one for purging only
            stores = VectorStores(self.storage.documents, _no_embedder, self._now)
        return stores

    async def sweep(self) -> int:
        """One round; how many documents it purged."""
        purged = 0
        retention = self.storage.retention
        if retention is not None:
            for namespace in retention.retention_s:
                for doc_id, doc in await retention.expired(namespace):
                    await self._purge(namespace, doc_id, doc)
                    purged += 1
        live = self._vector_stores()
        if live is not None:
            await live.prune_index()
        return purged

    async def _purge(self, namespace: str, doc_id: str, doc: dict[str, Any]) -> None:
        documents = self.storage.documents
        tenant = doc.get("tenant")
        if namespace == STORES and isinstance(tenant, str):
            await self._stores().purge(tenant, doc["id"])
        elif namespace == FILES and isinstance(tenant, str):
            await self._stores().forget_file(tenant, doc["id"])
            await documents.delete(CONTENTS, scoped_id(tenant, doc["id"]))
        logger.info("retention purged a document", extra={"namespace": namespace})
        await documents.delete(namespace, doc_id)
