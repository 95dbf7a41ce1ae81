"""Server-sent events framing for OpenAI streams: ``data: {json}\\n\\n`` ... ``data: [DONE]``."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from titan.protocol.raw import RawJSON

DONE = b"data: [DONE]\n\n"
# A comment line: clients ignore it, proxies and idle timers see traffic.
KEEP_ALIVE = b": keep-alive\n\n"


def encode_event(payload: BaseModel | RawJSON | dict[str, Any]) -> bytes:
    """One ``data:`` event. JSON never contains a raw newline, so one line is always enough."""
    if isinstance(payload, RawJSON):
        body = payload.data
    elif isinstance(payload, BaseModel):
        body = payload.model_dump_json().encode()
    else:
        body = orjson.dumps(payload)
    return b"data: " + body + b"\n\n"
