"""The OpenAI-compatible HTTP layer.

Imports only service, protocol, observability (and errors, config).
"""

from titan.api.app import create_app

__all__ = ["create_app"]
