"""Uploaded files (OpenAI's Files API), kept as text documents per tenant.

Only text is accepted (plain text, markdown, JSON, CSV...): retrieval embeds text, and a binary
file stored here could never be searched. A file's metadata and its content are two documents so
that listing files reads no content.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from titan.errors import InvalidRequestError, NotFoundError, TitanError
from titan.storage.base import DocumentStore

FILES = "files"
CONTENTS = "file_contents"
SEPARATOR = "\x1f"  # never in a tenant name nor in an id: tenant + id is one document id
MAX_FILE_BYTES = 4 * 1024**2
# Batch input (JSONL requests) and the output Titan writes: far more lines than a document.
MAX_BATCH_FILE_BYTES = 64 * 1024**2
BATCH_PURPOSES = ("batch", "batch_output")
PURPOSES = ("assistants", "batch", "batch_output", "fine-tune", "vision", "user_data", "evals")
FILE_ID = re.compile(r"file-[0-9a-f]{24}")
# Content types that are text whatever their charset claims; octet-stream is what clients send
# when they do not know (the openai SDK for an unknown extension): decoding decides then.
TEXT_TYPES = (
    "application/json",
    "application/jsonl",
    "application/x-ndjson",
    "application/octet-stream",
    "application/xml",
    "application/x-yaml",
    "application/yaml",
)


class FileTooLargeError(TitanError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "file_too_large"

    def __init__(self, size: int | None = None, limit: int = MAX_FILE_BYTES):
        got = f" ({size:,} bytes)" if size is not None else ""
        super().__init__(
            f"The file is too large{got}: files may hold at most {limit // 1024**2} MiB "
            f"of text ({MAX_BATCH_FILE_BYTES // 1024**2} MiB for purpose 'batch'). Split it "
            "into several files.",
            param="file",
        )


def max_bytes(purpose: str) -> int:
    return MAX_BATCH_FILE_BYTES if purpose in BATCH_PURPOSES else MAX_FILE_BYTES


def scoped_id(tenant: str, object_id: str) -> str:
    return f"{tenant}{SEPARATOR}{object_id}"


def page(
    items: list[dict[str, Any]], *, limit: int, order: str, after: str | None
) -> dict[str, Any]:
    """OpenAI's cursor page: newest first unless ``order`` is "asc"; ``after``: the last id of
    the previous page."""
    if order not in ("asc", "desc"):
        raise InvalidRequestError("'order' must be 'asc' or 'desc'.", param="order")
    if not 1 <= limit <= 10_000:
        raise InvalidRequestError("'limit' must be between 1 and 10000.", param="limit")
    ordered = sorted(items, key=lambda item: (item["created_at"], item["id"]))
    if order == "desc":
        ordered.reverse()
    if after is not None:
        ids = [item["id"] for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


def decode_text(data: bytes, content_type: str | None) -> str:
    """The file's text, or 400 for what is not text (images, PDFs, undecodable bytes)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind and not (kind.startswith("text/") or kind.endswith("+json") or kind in TEXT_TYPES):
        raise InvalidRequestError(
            f"Files must be text (plain text, markdown, JSON), not {kind}.",
            param="file",
            code="unsupported_file",
        )
    try:
        text = data.decode("utf-8-sig")  # a BOM is not part of the text
    except UnicodeDecodeError:
        raise InvalidRequestError(
            "The file is not UTF-8 text: only text files (plain text, markdown, JSON) can be "
            "uploaded.",
            param="file",
            code="unsupported_file",
        ) from None
    # UTF-8 decoding accepts NUL and other control bytes, which text files do not have.
    if "\x00" in text or sum(c < " " and c not in "\t\n\r\f" for c in text[:4096]) > 8:
        raise InvalidRequestError(
            "The file looks binary: only text files (plain text, markdown, JSON) can be uploaded.",
            param="file",
            code="unsupported_file",
        )
    return text


class Files:
    def __init__(self, documents: DocumentStore, now: Callable[[], float]):
        self.documents = documents
        self.now = now

    async def create(
        self, tenant: str, filename: str, purpose: str, data: bytes, content_type: str | None
    ) -> dict[str, Any]:
        if purpose not in PURPOSES:
            raise InvalidRequestError(
                f"Invalid purpose {purpose!r}: use one of {', '.join(PURPOSES)}.", param="purpose"
            )
        if len(data) > max_bytes(purpose):
            raise FileTooLargeError(len(data), max_bytes(purpose))
        text = decode_text(data, content_type)
        file = {
            "id": f"file-{uuid.uuid4().hex[:24]}",
            "object": "file",
            "bytes": len(data),
            "created_at": int(self.now()),
            "filename": filename or "upload.txt",
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        # Content first: a crash in between leaves an orphan content, never a file without one.
        await self.documents.put(CONTENTS, scoped_id(tenant, file["id"]), {"text": text})
        await self.documents.put(FILES, scoped_id(tenant, file["id"]), {**file, "tenant": tenant})
        return file

    async def get(self, tenant: str, file_id: str) -> dict[str, Any]:
        stored = None
        if FILE_ID.fullmatch(file_id):
            stored = await self.documents.get(FILES, scoped_id(tenant, file_id))
        if stored is None:
            raise NotFoundError(f"No such file: '{file_id}'.", param="file_id")
        stored.pop("tenant", None)
        return stored

    async def content(self, tenant: str, file_id: str) -> str:
        await self.get(tenant, file_id)
        stored = await self.documents.get(CONTENTS, scoped_id(tenant, file_id))
        if stored is None:
            raise NotFoundError(f"No such file: '{file_id}'.", param="file_id")
        return str(stored["text"])

    async def list(
        self,
        tenant: str,
        *,
        purpose: str | None = None,
        limit: int = 10_000,
        order: str = "desc",
        after: str | None = None,
    ) -> dict[str, Any]:
        files = []
        for _, stored in await self.documents.list(FILES):
            # The tenant field, not the id prefix: tenant "a" must not match tenant "a\x1fb".
            if stored.pop("tenant", None) == tenant and purpose in (None, stored["purpose"]):
                files.append(stored)
        return page(files, limit=limit, order=order, after=after)

    async def delete(self, tenant: str, file_id: str) -> dict[str, Any]:
        await self.get(tenant, file_id)
        await self.documents.delete(FILES, scoped_id(tenant, file_id))
        await self.documents.delete(CONTENTS, scoped_id(tenant, file_id))
        return {"id": file_id, "object": "file", "deleted": True}
