"""Stored responses (the Responses API's server-side conversations), tenant-scoped.

Each stored response keeps the whole conversation up to and including its own output, so a
``previous_response_id`` continues it with one read, whatever its length; trimming to the window
happens per request and never changes what is stored. The messages are chat messages that carry
their Responses items' ids (titan/service/response_items.py reads and writes them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from titan.errors import NotFoundError
from titan.storage.base import DocumentStore

NAMESPACE = "responses"
_SEPARATOR = "\x1f"  # never in a tenant name nor in a response id
# A conversation longer than this many messages keeps only its newest ones in storage.
MAX_STORED_MESSAGES = 2000


@dataclass(frozen=True)
class History:
    """A stored conversation: its messages, the running summary of its first ``summarized``
    messages, and how many first messages the last request left out of the prompt (trimming
    keeps them out while it can: a stable prefix)."""

    messages: list[dict[str, Any]]
    summary: str | None = None
    summarized: int = 0
    dropped: int = 0
    # The conversation's own id, the same for all its responses (a chain of
    # previous_response_id): an embedded engine reuses its earlier turns' KV under it.
    thread: str = ""

    def extended(self, *messages: dict[str, Any], **changes: Any) -> History:
        return replace(self, messages=[*self.messages, *messages], **changes)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


class Conversations:
    def __init__(self, documents: DocumentStore, *, now: Callable[[], float] = time.time):
        self.documents = documents
        self._now = now

    @staticmethod
    def _id(tenant: str, response_id: str) -> str:
        return f"{tenant}{_SEPARATOR}{response_id}"

    async def continued(self, tenant: str, previous_response_id: str | None) -> History:
        """The conversation a new response continues (no instructions: those are per request)."""
        if previous_response_id is None:
            return History([], thread=uuid.uuid4().hex)
        stored = await self.documents.get(NAMESPACE, self._id(tenant, previous_response_id))
        if stored is None:
            raise NotFoundError(
                f"No response with id '{previous_response_id}' (was it stored? 'store' must not "
                "be false).",
                param="previous_response_id",
            )
        return History(
            list(stored["messages"]),
            stored.get("summary"),
            int(stored.get("summarized", 0)),
            int(stored.get("dropped", 0)),
            stored.get("thread") or previous_response_id,
        )

    async def save(self, tenant: str, response: Mapping[str, Any], history: History) -> None:
        cut = max(0, len(history.messages) - MAX_STORED_MESSAGES)
        document = {
            "response": dict(response),
            "messages": history.messages[cut:],
            "summary": history.summary,
            "summarized": max(0, history.summarized - cut),
            "dropped": max(0, history.dropped - cut),
            "thread": history.thread,
            "stored_at": self._now(),
        }
        await self.documents.put(NAMESPACE, self._id(tenant, response["id"]), document)

    async def _stored(self, tenant: str, response_id: str) -> dict[str, Any]:
        stored = await self.documents.get(NAMESPACE, self._id(tenant, response_id))
        if stored is None:
            raise NotFoundError(f"No response with id '{response_id}'.", param="response_id")
        return stored

    async def get(self, tenant: str, response_id: str) -> dict[str, Any]:
        return dict((await self._stored(tenant, response_id))["response"])

    async def messages(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        """The stored conversation up to and including the response's own answer (its last
        message)."""
        return list((await self._stored(tenant, response_id))["messages"])

    async def delete(self, tenant: str, response_id: str) -> None:
        if not await self.documents.delete(NAMESPACE, self._id(tenant, response_id)):
            raise NotFoundError(f"No response with id '{response_id}'.", param="response_id")
