"""OpenAI's Files API: /v1/files (multipart upload, list), /v1/files/{id} (get, delete),
/v1/files/{id}/content. Files are text and belong to the caller's tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from titan.api.parsing import presented_api_key
from titan.api.state import services_of
from titan.errors import InvalidRequestError
from titan.service.rag import MAX_BATCH_FILE_BYTES, FileTooLargeError, RagService

# The largest file (a batch's), and room for the multipart framing and the purpose field.
MAX_UPLOAD_BYTES = MAX_BATCH_FILE_BYTES + 64 * 1024


async def caller(request: Request) -> tuple[RagService, str]:
    rag = services_of(request).rag
    return rag, await rag.tenant(presented_api_key(request))


def list_params(request: Request, default_limit: int) -> dict:
    query = request.query_params
    limit = query.get("limit", str(default_limit))
    if not limit.isdigit():
        raise InvalidRequestError("'limit' must be a positive integer.", param="limit")
    return {"limit": int(limit), "order": query.get("order", "desc"), "after": query.get("after")}


async def _capped(request: Request) -> AsyncIterator[bytes]:
    """The body, stopped with 413 at the limit (request.form() would spool any size to disk)."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_UPLOAD_BYTES:
            raise FileTooLargeError(limit=MAX_BATCH_FILE_BYTES)
        yield chunk


async def create_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES:
        raise FileTooLargeError(int(declared), MAX_BATCH_FILE_BYTES)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequestError(
            "Upload files as multipart/form-data with the fields 'file' and 'purpose'.",
            param="file",
        )
    try:
        form = await MultiPartParser(request.headers, _capped(request), max_files=1).parse()
    except MultiPartException as exc:
        raise InvalidRequestError(f"Invalid multipart body: {exc.message}", param="file") from None
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise InvalidRequestError("The form needs a 'file' field holding a file.", param="file")
        if not isinstance(purpose, str):
            raise InvalidRequestError("The form needs a 'purpose' field.", param="purpose")
        data = await upload.read(MAX_BATCH_FILE_BYTES + 1)
        created = await rag.files().create(
            tenant, upload.filename or "", purpose, data, upload.content_type
        )
    finally:
        await form.close()
    return JSONResponse(created)


async def list_files(request: Request) -> Response:
    rag, tenant = await caller(request)
    purpose = request.query_params.get("purpose")
    page = await rag.files().list(tenant, purpose=purpose, **list_params(request, 10_000))
    return JSONResponse(page)


async def retrieve_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    return JSONResponse(await rag.files().get(tenant, request.path_params["file_id"]))


async def file_content(request: Request) -> Response:
    rag, tenant = await caller(request)
    return PlainTextResponse(await rag.files().content(tenant, request.path_params["file_id"]))


async def delete_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    return JSONResponse(await rag.delete_file(tenant, request.path_params["file_id"]))
