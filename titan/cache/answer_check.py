"""Whether a fresh answer agrees with the one cached for a similar question: the outcome of a
semantic-cache verification (titan/cache/error_budget.py).

Deterministic requests (temperature 0 or a fixed seed) agree only on the same text: the model
would have written exactly that, so anything else is a different answer. Sampled ones agree when
the embeddings of the two texts are close (``answer_similarity``): two samples of one right
answer differ in wording, two answers to different questions differ in meaning. Tool calls
compare by name and arguments (their ids are new on every answer).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import orjson


class TextEmbedder(Protocol):
    async def embed(self, text: str) -> Any: ...


def answer_text(value: bytes) -> str:
    """The text of a stored answer: each choice's content (chat) or text (completions), with
    its tool calls; the raw bytes when they are not an answer Titan knows."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.decode("utf-8", "replace").strip()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return value.decode("utf-8", "replace").strip()
    parts = []
    for choice in sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        parts.append(str(message.get("content") or choice.get("text") or ""))
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            parts.append(f"{function.get('name')}({function.get('arguments')})")
    return "\n".join(parts).strip()


async def answers_agree(
    cached: bytes,
    fresh: bytes,
    *,
    is_deterministic: bool,
    embedder: TextEmbedder,
    answer_similarity: float,
) -> bool:
    one, other = answer_text(cached), answer_text(fresh)
    if " ".join(one.split()) == " ".join(other.split()):
        return True
    if is_deterministic or not (one and other):
        return False
    first = np.asarray(await embedder.embed(one), dtype=np.float32)
    second = np.asarray(await embedder.embed(other), dtype=np.float32)
    return float(np.dot(first, second)) >= answer_similarity
