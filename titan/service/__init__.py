"""The request pipeline between the HTTP layer and the backends; no HTTP types here."""

from titan.service.admin import AdminService, parse_time
from titan.service.attempts import Routed
from titan.service.pipeline import Pipeline, Services, build_pipeline
from titan.service.requests import RequestFlow
from titan.service.responses import ResponsesService
from titan.service.streaming import close_stream

__all__ = [
    "AdminService",
    "Pipeline",
    "RequestFlow",
    "ResponsesService",
    "Routed",
    "Services",
    "build_pipeline",
    "close_stream",
    "parse_time",
]
