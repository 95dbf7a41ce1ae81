"""The embedded backend: the in-process engine (titan.engine) behind the Backend protocol.

backend.py serves requests; runs.py turns a request into engine requests, one per choice;
choices.py (n, best_of, beam search), convert.py (sampling params, logprobs), tools.py,
tool_parser.py, tool_stream.py and call_cut.py (tool calls); engine_handle.py types the engine.
"""

from titan.backends.embedded.backend import EmbeddedBackend, engine_config

__all__ = ["EmbeddedBackend", "engine_config"]
