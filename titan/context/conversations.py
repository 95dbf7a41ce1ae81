"""Stored responses (the Responses API's server-side conversations), tenant-scoped.

Each stored response keeps the whole conversation up to and including its own output, so a
``previous_response_id`` continues it with one read, whatever its length; trimming to the window
happens per request and never changes what is stored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from titan.errors import InvalidRequestError, NotFoundError
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

    def extended(self, *messages: dict[str, Any], **changes: Any) -> History:
        return replace(self, messages=[*self.messages, *messages], **changes)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def input_messages(input_value: Any) -> list[dict[str, Any]]:
    """The Responses API's ``input`` (a string, or items) as chat messages."""
    if isinstance(input_value, str):
        return [{"role": "user", "content": input_value}]
    if not isinstance(input_value, list) or not input_value:
        raise InvalidRequestError(
            "Invalid 'input': give a string or a non-empty list of message items.", param="input"
        )
    messages = []
    for index, item in enumerate(input_value):
        if not isinstance(item, Mapping) or item.get("type", "message") != "message":
            raise InvalidRequestError(
                f"Invalid 'input[{index}]': only message items ({{'role', 'content'}}) are "
                "supported.",
                param=f"input[{index}]",
            )
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequestError(
                f"Invalid 'input[{index}].role' {role!r}: use user, assistant, system or "
                "developer.",
                param=f"input[{index}].role",
            )
        messages.append({"role": "system" if role == "developer" else role,
                         "content": _text(item.get("content"), index)})  # fmt: skip
    return messages


def _text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in (
                "input_text", "output_text", "text",
            ):  # fmt: skip
                texts.append(str(part.get("text", "")))
            else:
                raise InvalidRequestError(
                    f"Invalid 'input[{index}].content': only text parts are supported.",
                    param=f"input[{index}].content",
                )
        return "".join(texts)
    raise InvalidRequestError(
        f"Invalid 'input[{index}].content': give a string or text parts.",
        param=f"input[{index}].content",
    )


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
            return History([])
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
        )

    async def save(self, tenant: str, response: Mapping[str, Any], history: History) -> None:
        cut = max(0, len(history.messages) - MAX_STORED_MESSAGES)
        document = {
            "response": dict(response),
            "messages": history.messages[cut:],
            "summary": history.summary,
            "summarized": max(0, history.summarized - cut),
            "dropped": max(0, history.dropped - cut),
            "stored_at": self._now(),
        }
        await self.documents.put(NAMESPACE, self._id(tenant, response["id"]), document)

    async def get(self, tenant: str, response_id: str) -> dict[str, Any]:
        stored = await self.documents.get(NAMESPACE, self._id(tenant, response_id))
        if stored is None:
            raise NotFoundError(f"No response with id '{response_id}'.", param="response_id")
        return dict(stored["response"])

    async def delete(self, tenant: str, response_id: str) -> None:
        if not await self.documents.delete(NAMESPACE, self._id(tenant, response_id)):
            raise NotFoundError(f"No response with id '{response_id}'.", param="response_id")
