"""Logs now; metrics, tracing and events come later."""

from titan.observability.logging import JsonFormatter, configure_logging

__all__ = ["JsonFormatter", "configure_logging"]
