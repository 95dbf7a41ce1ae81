"""Async jobs (/v1/jobs: submit, get, cancel, list) and OpenAI's Batch API (/v1/batches: create,
get, cancel, list; its files through /v1/files)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.parsing import presented_api_key, read_json_object
from titan.api.routes.files import list_params
from titan.api.state import services_of
from titan.service.jobs import JobsService

IDEMPOTENT_REPLAY_HEADER = "x-titan-idempotent-replay"


def _service(request: Request) -> tuple[JobsService, str | None]:
    return services_of(request).jobs, presented_api_key(request)


async def submit_job(request: Request) -> Response:
    jobs, api_key = _service(request)
    job, is_new = await jobs.submit(await read_json_object(request), api_key)
    if is_new:
        return JSONResponse(job, status_code=202)
    return JSONResponse(job, headers={IDEMPOTENT_REPLAY_HEADER: "true"})


async def get_job(request: Request) -> Response:
    jobs, api_key = _service(request)
    return JSONResponse(await jobs.get(request.path_params["job_id"], api_key))


async def cancel_job(request: Request) -> Response:
    jobs, api_key = _service(request)
    return JSONResponse(await jobs.cancel(request.path_params["job_id"], api_key))


async def list_jobs(request: Request) -> Response:
    jobs, api_key = _service(request)
    paging = list_params(request, 20)
    page = await jobs.list(
        api_key,
        status=request.query_params.get("status"),
        batch_id=request.query_params.get("batch_id"),
        limit=paging["limit"],
        after=paging["after"],
    )
    return JSONResponse(page)


async def create_batch(request: Request) -> Response:
    jobs, api_key = _service(request)
    body = await read_json_object(request)
    owner = await jobs.owner(api_key)
    batch = await jobs.batches.create(owner, body)
    if jobs.worker is not None:
        jobs.worker.wake()
    return JSONResponse(batch)


async def get_batch(request: Request) -> Response:
    jobs, api_key = _service(request)
    owner = await jobs.owner(api_key)
    return JSONResponse(await jobs.batches.get(owner.tenant, request.path_params["batch_id"]))


async def cancel_batch(request: Request) -> Response:
    jobs, api_key = _service(request)
    owner = await jobs.owner(api_key)
    return JSONResponse(await jobs.batches.cancel(owner.tenant, request.path_params["batch_id"]))


async def list_batches(request: Request) -> Response:
    jobs, api_key = _service(request)
    owner = await jobs.owner(api_key)
    paging = list_params(request, 20)
    page = await jobs.batches.list(owner.tenant, limit=paging["limit"], after=paging["after"])
    return JSONResponse(page)
