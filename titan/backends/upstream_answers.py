"""Checks on what an upstream answered with a 2xx: a body that is not JSON (an HTML page from a
proxy, a truncated document), or JSON of the wrong shape (no ``choices``, wrong types), is the
upstream's failure — a retryable 502 ``upstream_malformed_response`` — never bytes passed on to a
client whose SDK then fails to parse them, and never a 500.

Only the shape the OpenAI SDKs rely on is checked (``choices`` a list of objects, each with its
``message`` object or ``text`` string; a stream chunk's ``choices`` or ``usage``): vendor fields
pass untouched. The bytes are parsed once here; the answer still goes on as the upstream's bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from titan.backends.upstream_errors import error_from_stream_event
from titan.errors import UpstreamError

MALFORMED_CODE = "upstream_malformed_response"
SNIPPET_CHARS = 120  # of a page or text, quoted in the error so an operator sees what came back
# What each endpoint's whole answer carries in each choice.
_CHOICE_FIELDS: dict[str, tuple[str, type]] = {
    "chat": ("message", dict),
    "completion": ("text", str),
}


def malformed(name: str, what: str, body: bytes, content_type: str | None = None) -> UpstreamError:
    """A 502 saying what was wrong. A page or text is quoted (its start: what a proxy said); JSON
    is only described (its keys), since it may hold generated text that logs must not keep."""
    kind = f", content-type {content_type!r}" if content_type else ""
    if body.lstrip()[:1] in (b"{", b"["):
        document = _decoded(body)
        keys = f" with keys {sorted(document)[:8]}" if isinstance(document, dict) else ""
        detail = f"{len(body)} bytes of JSON{keys}" if document is not None else "invalid JSON"
    else:
        detail = repr(body[:SNIPPET_CHARS].decode("utf-8", "replace").strip())
    return UpstreamError(
        f"Upstream '{name}' sent {what}{kind}: {detail}", status_code=502, code=MALFORMED_CODE
    )


def _decoded(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _has_choice_list(document: dict[str, Any]) -> bool:
    choices = document.get("choices")
    return isinstance(choices, list) and all(isinstance(c, dict) for c in choices)


def check_answer(body: bytes, endpoint: str, name: str, content_type: str | None) -> None:
    """Raises UpstreamError unless ``body`` is a whole chat/completion answer (or, from servers
    that send errors with a 200, the upstream's error as its own UpstreamError)."""
    document = _decoded(body)
    if not isinstance(document, dict):
        raise malformed(name, "a body that is not a JSON object", body, content_type)
    if "choices" not in document and "error" in document:
        error = error_from_stream_event(body, is_error_event=False)
        if error is not None:
            raise error
    field, kind = _CHOICE_FIELDS[endpoint]
    if not _has_choice_list(document) or not all(
        isinstance(choice.get(field), kind) for choice in document["choices"]
    ):
        raise malformed(name, f"an answer without a list of choices with their '{field}'", body)
    if not isinstance(document.get("usage", {}), dict | None):
        raise malformed(name, "an answer whose 'usage' is not an object", body)


def check_chunk(data: bytes, name: str) -> bool:
    """Raises UpstreamError unless ``data`` is a stream chunk; True when it finishes a choice (a
    ``finish_reason``), which is how a stream that ends without ``[DONE]`` is told from a
    truncated one. Runs on every chunk of every stream: one parse and a loop (1-2 µs a chunk
    on the 2-core dev machine, most of it orjson)."""
    document = _decoded(data)
    if type(document) is not dict:
        raise malformed(name, "a stream event that is not a JSON object", data)
    choices = document.get("choices")
    if type(choices) is list:
        has_finished = False
        for choice in choices:
            if type(choice) is not dict:
                break
            has_finished = has_finished or choice.get("finish_reason") is not None
        else:
            return has_finished
    # A usage-only chunk may leave choices out; any other chunk needs them.
    elif "choices" not in document and type(document.get("usage")) is dict:
        return False
    raise malformed(name, "a stream chunk without a list of choices", data)
