"""What the app keeps between requests: the pipeline and how its start went."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request

from titan.service import Pipeline


@dataclass
class AppState:
    pipeline: Pipeline
    start_task: asyncio.Task[None] | None = None
    start_error: BaseException | None = None


def app_state(request: Request) -> AppState:
    return request.app.state.titan


def pipeline_of(request: Request) -> Pipeline:
    return request.app.state.titan.pipeline
