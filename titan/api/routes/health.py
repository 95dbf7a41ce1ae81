"""GET /health (the process is alive), GET /ready (the models are loaded and warmed, the
shared storage reachable) and GET /stats (each model's engine counters: requests, tokens, KV
cache use)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from titan.api.state import app_state, pipeline_of


async def health(request: Request) -> Response:
    # Answers from the event loop alone: a slow /health means a blocked loop.
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    state = app_state(request)
    if state.start_error is not None:
        return JSONResponse({"status": "failed", "error": str(state.start_error)}, status_code=503)
    if not state.pipeline.is_ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    reason = await state.pipeline.storage_unreachable()
    if reason is not None:  # requests needing it would fail: send traffic elsewhere
        return JSONResponse({"status": "storage_unavailable", "error": reason}, status_code=503)
    return JSONResponse({"status": "ready"})


async def stats(request: Request) -> Response:
    return JSONResponse({"models": pipeline_of(request).stats()})
