"""``create_app(config)``: the Starlette application behind ``titan serve``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from titan.api.errors import CatchAllMiddleware, exception_handlers
from titan.api.routes import all_routes
from titan.api.state import AppState
from titan.config import TitanConfig
from titan.service import Pipeline, build_pipeline

logger = logging.getLogger("titan.api")

StartFailureHook = Callable[[BaseException], None]


async def _start_pipeline(state: AppState, on_start_failure: StartFailureHook | None) -> None:
    started_at = time.monotonic()
    try:
        await state.pipeline.start()
    except Exception as exc:
        state.start_error = exc
        logger.exception("startup failed: the models could not be loaded")
        if on_start_failure is not None:
            on_start_failure(exc)
        return
    logger.info(
        "ready",
        extra={
            "models": state.pipeline.model_ids(),
            "startup_s": round(time.monotonic() - started_at, 2),
        },
    )


def create_app(
    config: TitanConfig,
    *,
    pipeline: Pipeline | None = None,
    on_start_failure: StartFailureHook | None = None,
) -> Starlette:
    """The app for ``config``. ``pipeline`` replaces the one the config describes (tests);
    ``on_start_failure`` is called when the models fail to load (the CLI stops the server).

    The lifespan starts the backends in the background: /health answers at once, /ready says
    503 until every model is loaded and warmed.
    """
    state = AppState(
        pipeline if pipeline is not None else build_pipeline(config), limits=config.server.limits
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_task = asyncio.create_task(_start_pipeline(state, on_start_failure))
        try:
            yield
        finally:
            state.start_task.cancel()
            await asyncio.gather(state.start_task, return_exceptions=True)
            await state.pipeline.shutdown()
            logger.info("shut down")

    app = Starlette(
        routes=all_routes(),
        middleware=[Middleware(CatchAllMiddleware)],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.titan = state
    return app
