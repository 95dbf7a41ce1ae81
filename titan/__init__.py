"""Titan: an OpenAI-compatible LLM serving system that keeps steady under transients.

The public API is ``__all__``; names resolve lazily, so ``import titan`` loads neither torch nor
the HTTP stack.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS = {
    "TitanConfig": "titan.config",
    "create_app": "titan.api",
    "EngineConfig": "titan.engine.config",
    "SamplingParams": "titan.engine.sampling_params",
    "AsyncEngine": "titan.engine.async_engine",
}

__all__ = [
    "AsyncEngine",
    "EngineConfig",
    "SamplingParams",
    "TitanConfig",
    "__version__",
    "create_app",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'titan' has no attribute {name!r}")
