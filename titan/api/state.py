"""What the app keeps between requests: the pipeline and how its start went; the services its
start built, for the routes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from titan.config import RequestLimits
from titan.errors import ServiceUnavailableError
from titan.service import Pipeline, RequestFlow, Services


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


def services_of(request: Request) -> Services:
    """The services the pipeline's start built; 503 until it has."""
    services = pipeline_of(request).services
    if services is None:
        raise ServiceUnavailableError("Titan is still starting; retry shortly.")
    return services


def flow_of(request: Request) -> RequestFlow:
    """The request path; 503 while the models load."""
    services = pipeline_of(request).services
    if services is None:
        raise ServiceUnavailableError("The models are still loading; retry shortly.")
    return services.flow


def limits_of(request: Request) -> RequestLimits:
    """The request bounds of the app serving ``request`` (defaults for apps without a state)."""
    state = getattr(request.app.state, "titan", None) if "app" in request.scope else None
    return state.limits if state is not None else RequestLimits()
