"""One backend per configured deployment."""

from __future__ import annotations

from titan.backends.base import Backend
from titan.config import Deployment, EmbeddedDeployment, OpenAIDeployment, SimulatedDeployment


def create_backend(deployment: Deployment, *, model_name: str | None, name: str) -> Backend:
    """``model_name``: the name clients use (None: an embedded engine names its model)."""
    # Imported per kind: an embedded-only server never loads the HTTP client, and the reverse.
    if isinstance(deployment, EmbeddedDeployment):
        from titan.backends.embedded import EmbeddedBackend

        return EmbeddedBackend(deployment, model_name=model_name, name=name)
    if isinstance(deployment, OpenAIDeployment):
        from titan.backends.openai_compat import OpenAIBackend

        return OpenAIBackend(deployment, model_name=model_name or "", name=name)
    if isinstance(deployment, SimulatedDeployment):
        from titan.backends.simulated import SimulatedBackend

        return SimulatedBackend(deployment, model_name=model_name or "simulated", name=name)
    raise TypeError(f"unknown deployment kind {deployment!r}")
