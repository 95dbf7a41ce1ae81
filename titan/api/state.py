"""What the app keeps between requests: the pipeline and how its start went."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from titan.config import RequestLimits
from titan.service import Pipeline


@dataclass
class AppState:
    pipeline: Pipeline
    limits: RequestLimits = field(default_factory=RequestLimits)
    start_task: asyncio.Task[None] | None = None
    start_error: BaseException | None = None


def app_state(request: Request) -> AppState:
    return request.app.state.titan


def pipeline_of(request: Request) -> Pipeline:
    return request.app.state.titan.pipeline


def limits_of(request: Request) -> RequestLimits:
    """The request bounds of the app serving ``request`` (defaults for apps without a state)."""
    state = getattr(request.app.state, "titan", None) if "app" in request.scope else None
    return state.limits if state is not None else RequestLimits()
