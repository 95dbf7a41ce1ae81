"""Answers passed through from an upstream as they came, without decoding and re-encoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel


@dataclass(frozen=True)
class RawJSON:
    """One JSON document (a whole answer, or one stream chunk) exactly as the upstream sent it."""

    data: bytes

    def parsed(self) -> Any:
        """Decoded on demand (usage accounting, tests); the hot path never needs it."""
        return orjson.loads(self.data)


# What a backend hands back: Titan's own typed objects, or an upstream's bytes.
Answer = BaseModel | RawJSON


def answer_bytes(answer: Answer) -> bytes:
    if isinstance(answer, RawJSON):
        return answer.data
    return answer.model_dump_json().encode()
