"""OpenAI's Vector Stores API: /v1/vector_stores (create, list), /v1/vector_stores/{id} (get,
delete), /v1/vector_stores/{id}/files (add, list, get, remove), /v1/vector_stores/{id}/search."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.parsing import read_json_object
from titan.api.routes.files import caller, list_params
from titan.errors import InvalidRequestError


def _string_list(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidRequestError(f"'{name}' must be a list of strings.", param=name)
    return value


async def create_store(request: Request) -> Response:
    rag, tenant = await caller(request)
    body = await read_json_object(request)
    name, metadata = body.get("name"), body.get("metadata")
    if name is not None and not isinstance(name, str):
        raise InvalidRequestError("'name' must be a string.", param="name")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequestError("'metadata' must be an object.", param="metadata")
    stores = rag.stores()
    created = await stores.create(
        tenant,
        name=name,
        file_ids=_string_list(body, "file_ids"),
        metadata=metadata,
        chunking_strategy=body.get("chunking_strategy"),
    )
    return JSONResponse(created)


async def list_stores(request: Request) -> Response:
    rag, tenant = await caller(request)
    return JSONResponse(await rag.stores().list(tenant, **list_params(request, 20)))


async def retrieve_store(request: Request) -> Response:
    rag, tenant = await caller(request)
    store_id = request.path_params["vector_store_id"]
    return JSONResponse(await rag.stores().get(tenant, store_id))


async def delete_store(request: Request) -> Response:
    rag, tenant = await caller(request)
    store_id = request.path_params["vector_store_id"]
    return JSONResponse(await rag.stores().delete(tenant, store_id))


async def add_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    body = await read_json_object(request)
    file_id = body.get("file_id")
    if not isinstance(file_id, str):
        raise InvalidRequestError("'file_id' is required.", param="file_id")
    stores = rag.stores()
    added = await stores.add_file(
        tenant,
        request.path_params["vector_store_id"],
        file_id,
        chunking_strategy=body.get("chunking_strategy"),
    )
    return JSONResponse(added)


async def list_files(request: Request) -> Response:
    rag, tenant = await caller(request)
    stores = rag.stores()
    page = await stores.list_files(
        tenant,
        request.path_params["vector_store_id"],
        status=request.query_params.get("filter"),
        **list_params(request, 20),
    )
    return JSONResponse(page)


async def retrieve_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    path = request.path_params
    stores = rag.stores()
    return JSONResponse(await stores.get_file(tenant, path["vector_store_id"], path["file_id"]))


async def remove_file(request: Request) -> Response:
    rag, tenant = await caller(request)
    path = request.path_params
    stores = rag.stores()
    return JSONResponse(await stores.remove_file(tenant, path["vector_store_id"], path["file_id"]))


async def search(request: Request) -> Response:
    rag, tenant = await caller(request)
    body = await read_json_object(request)
    stores = rag.stores()
    results = await stores.search(
        tenant,
        request.path_params["vector_store_id"],
        body.get("query"),
        body.get("max_num_results", 10),
        body.get("ranking_options"),
    )
    return JSONResponse(results)
