"""Keys, usage and the cache: /admin/keys, /admin/usage, /admin/cache (master key), /v1/usage
(a key's own), /metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.parsing import presented_api_key, read_json_object
from titan.api.state import pipeline_of, services_of
from titan.service import AdminService, parse_time


def _admin(request: Request, *, needs_master_key: bool = True) -> AdminService:
    admin = services_of(request).admin
    if needs_master_key:
        admin.check_master_key(presented_api_key(request))
    return admin


async def create_key(request: Request) -> Response:
    admin = _admin(request)
    return JSONResponse(await admin.create_key(await read_json_object(request)), status_code=201)


async def list_keys(request: Request) -> Response:
    keys = await _admin(request).list_keys(request.query_params.get("tenant"))
    return JSONResponse({"object": "list", "data": keys})


async def revoke_key(request: Request) -> Response:
    return JSONResponse(await _admin(request).revoke_key(request.path_params["key_id"]))


def _period(request: Request) -> tuple[str, float | None, float | None]:
    query = request.query_params
    return (
        query.get("granularity", "day"),
        parse_time(query.get("start"), "start"),
        parse_time(query.get("end"), "end"),
    )


async def all_usage(request: Request) -> Response:
    admin = _admin(request)
    granularity, start, end = _period(request)
    scope = request.query_params.get("scope")
    return JSONResponse(await admin.usage(scope, granularity, start, end))


async def own_usage(request: Request) -> Response:
    admin = _admin(request, needs_master_key=False)
    granularity, start, end = _period(request)
    usage = await admin.own_usage(presented_api_key(request), granularity, start, end)
    return JSONResponse(usage)


async def cache_stats(request: Request) -> Response:
    return JSONResponse(await _admin(request).cache_stats())


async def flush_cache(request: Request) -> Response:
    query = request.query_params
    admin = _admin(request)
    return JSONResponse(await admin.flush_cache(query.get("tenant"), query.get("model")))


async def metrics(request: Request) -> Response:
    pipeline = pipeline_of(request)
    return Response(pipeline.metrics.render(), media_type=pipeline.metrics.content_type)
