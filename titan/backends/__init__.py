"""Backends: one protocol (base.Backend), several adapters (embedded engine for now)."""

from titan.backends.base import Backend
from titan.backends.embedded import EmbeddedBackend

__all__ = ["Backend", "EmbeddedBackend"]
