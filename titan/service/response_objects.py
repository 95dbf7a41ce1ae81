"""The Responses API's objects: a Response, its file_search item and citations, and stream
events."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from titan.context.conversations import new_response_id
from titan.context.trimming import Trimmed
from titan.service.response_body import FILE_SEARCH_RESULTS, ResponsesBody, output_logprobs
from titan.service.response_items import function_call_item, message_item, new_item_id


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


def file_search_item(sources: list[dict], query: str) -> dict[str, Any]:
    """The search that ran, with its results (stored whole; ``presented`` leaves them out of
    an answer unless ``include`` asks for them, as OpenAI does)."""
    return {
        "type": "file_search_call",
        "id": new_item_id("fs"),
        "status": "completed",
        "queries": [query],
        "results": [
            {
                "file_id": s["file_id"],
                "filename": s["filename"],
                "score": s["score"],
                "text": "".join(part.get("text", "") for part in s["content"]),
                "attributes": s.get("attributes") or {},
            }
            for s in sources
        ],
    }


def presented(response: Mapping[str, Any], includes: frozenset[str]) -> dict[str, Any]:
    """A response as a client gets it: file_search results only when ``include`` has them."""
    if FILE_SEARCH_RESULTS in includes:
        return dict(response)
    output = [
        {**item, "results": None} if item.get("type") == "file_search_call" else item
        for item in response.get("output") or ()
    ]
    return {**response, "output": output}


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


def answer_items(
    choice: Mapping[str, Any], sources: list[dict] | None, with_logprobs: bool
) -> list[dict[str, Any]]:
    """A chat completion's choice as output items: its text as a message (none when it only
    called tools), then one function_call per tool call."""
    message = choice.get("message") or {}
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    items = []
    if text or not calls:
        cut = cut_reason(choice.get("finish_reason")) is not None
        logprobs = output_logprobs(choice.get("logprobs")) if with_logprobs else []
        items.append(
            message_item(
                new_item_id("msg"),
                text,
                logprobs=logprobs,
                status="incomplete" if cut and not calls else "completed",
                annotations=citations(sources, len(text)),
            )
        )
    for call in calls:
        function = call.get("function") or {}
        items.append(
            function_call_item(
                new_item_id("fc"),
                call["id"],
                function.get("name", ""),
                function.get("arguments", ""),
            )
        )
    return items


class EventWriter:
    """SSE events of the Responses API: ``event:`` and ``data:`` lines, numbered."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def response_object(
    body: ResponsesBody,
    model: str,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: Mapping[str, Any] | None,
    trimmed: Trimmed,
    *,
    response_id: str | None = None,
    created_at: float | None = None,
    summarized: int = 0,
    status: str | None = None,
) -> dict[str, Any]:
    """The Response object: ``output`` items, the request's settings echoed, usage, and
    ``status`` from the chat completion's finish reason unless given."""
    prompt = int((usage or {}).get("prompt_tokens", trimmed.num_prompt_tokens))
    completion = int((usage or {}).get("completion_tokens", 0))
    # The prompt tokens an engine's prefix cache served (the turns before this one, mostly).
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    reason = cut_reason(finish_reason)
    if status is None:
        status = "incomplete" if reason else "completed"
    now = int(time.time())
    return {
        "id": response_id or new_response_id(),
        "object": "response",
        "created_at": created_at or now,
        "status": status,
        "completed_at": now if status == "completed" else None,
        "incomplete_details": {"reason": reason} if status == "incomplete" else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": body.instructions,
        "previous_response_id": body.previous_response_id,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_logprobs": body.top_logprobs or 0,
        "metadata": body.metadata,
        "store": body.store,
        "background": False,
        "parallel_tool_calls": body.parallel_tool_calls,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools,
        "text": body.text or {"format": {"type": "text"}},
        "truncation": body.truncation or "auto",
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "user": body.user,
        "prompt_cache_key": body.prompt_cache_key,
        "safety_identifier": body.safety_identifier,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
        # Titan's extension: what trimming left out of this turn's prompt.
        "context": {
            "dropped_turns": trimmed.num_dropped_turns,
            "dropped_messages": trimmed.num_dropped_messages,
            "prompt_tokens_counted": trimmed.num_prompt_tokens,
            "prompt_budget": trimmed.budget,
            "summarized_messages": summarized,
        },
    }


def cut_reason(finish_reason: str | None) -> str | None:
    """OpenAI's two incomplete reasons: cut by the output budget, or by a guardrail."""
    return {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish_reason or ""
    )
