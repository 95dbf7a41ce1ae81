"""The request pipeline between the HTTP layer and the backends; no HTTP types here."""

from titan.service.pipeline import Pipeline, build_pipeline
from titan.service.streaming import close_stream, start_stream

__all__ = ["Pipeline", "build_pipeline", "close_stream", "start_stream"]
