"""The Responses API's objects: a Response, its output items, citations, and stream events."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from titan.context.conversations import new_response_id
from titan.context.trimming import Trimmed

if TYPE_CHECKING:  # annotations only: responses.py imports this module
    from titan.service.responses import ResponsesBody


def sources_prompt(sources: list[dict]) -> str:
    """The retrieved chunks as the model sees them: numbered, with their file."""
    blocks = [
        f"[{n}] {source['filename']} ({source['file_id']}):\n"
        + "".join(part.get("text", "") for part in source["content"])
        for n, source in enumerate(sources, start=1)
    ]
    return (
        "Answer from these sources when they hold the answer, and cite them as [n].\n\n"
        + "\n\n".join(blocks)
    )


def file_search_item(sources: list[dict]) -> dict[str, Any]:
    return {
        "type": "file_search_call",
        "id": f"fs_{uuid.uuid4().hex}",
        "status": "completed",
        "queries": [],
        "results": [
            {
                "file_id": s["file_id"],
                "filename": s["filename"],
                "score": s["score"],
                "text": "".join(part.get("text", "") for part in s["content"]),
                "attributes": {},
            }
            for s in sources
        ],
    }


def citations(sources: list[dict] | None, text_length: int) -> list[dict[str, Any]]:
    """One file citation per source given to the model, at the end of the answer."""
    return [
        {
            "type": "file_citation",
            "file_id": s["file_id"],
            "filename": s["filename"],
            "index": text_length,
        }
        for s in sources or []
    ]


class EventWriter:
    """SSE events of the Responses API: ``event:`` and ``data:`` lines, numbered."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def response_item_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def response_object(
    body: ResponsesBody,
    model: str,
    text: str,
    finish_reason: str | None,
    usage: Mapping[str, Any] | None,
    trimmed: Trimmed,
    *,
    item_id: str | None = None,
    response_id: str | None = None,
    created_at: float | None = None,
    sources: list[dict] | None = None,
    summarized: int = 0,
) -> dict[str, Any]:
    prompt = int((usage or {}).get("prompt_tokens", trimmed.num_prompt_tokens))
    completion = int((usage or {}).get("completion_tokens", 0))
    # The prompt tokens an engine's prefix cache served (the turns before this one, mostly).
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    # Cut by the output budget, or by a guardrail (OpenAI's two incomplete reasons).
    cut_reason = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish_reason or ""
    )
    is_cut = cut_reason is not None
    message = {
        "type": "message",
        "id": item_id or response_item_id(),
        "status": "incomplete" if is_cut else "completed",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": text, "annotations": citations(sources, len(text))}
        ],
    }
    output = ([file_search_item(sources)] if sources else []) + [message]
    return {
        "id": response_id or new_response_id(),
        "object": "response",
        "created_at": created_at or int(time.time()),
        "status": "incomplete" if is_cut else "completed",
        "incomplete_details": {"reason": cut_reason} if is_cut else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": body.instructions,
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "metadata": body.metadata,
        "store": body.store,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        # Titan's extension: what trimming left out of this turn's prompt.
        "context": {
            "dropped_turns": trimmed.num_dropped_turns,
            "dropped_messages": trimmed.num_dropped_messages,
            "prompt_tokens_counted": trimmed.num_prompt_tokens,
            "summarized_messages": summarized,
        },
    }
