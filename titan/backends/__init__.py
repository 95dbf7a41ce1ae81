"""Backends: one protocol (base.Backend), an adapter per kind of deployment: the embedded engine,
any OpenAI-compatible upstream, and a simulated backend for tests, benchmarks and chaos runs."""

from titan.backends.base import Backend
from titan.backends.factory import create_backend

__all__ = ["Backend", "create_backend"]
