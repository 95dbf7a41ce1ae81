"""Cached answers in and out: a whole answer is stored as its JSON; a stream is assembled into
the whole answer it amounts to; a stored answer is replayed as JSON or as OpenAI stream chunks
(content, tool calls, finish reasons and the original usage)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from titan.protocol import Answer, RawJSON, answer_bytes, make_id


def _fresh(stored: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The stored answer under a new id and creation time: it is a new response."""
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    return {**stored, "id": make_id(prefix), "created": int(time.time())}


def replay_whole(value: bytes, endpoint: str) -> Answer:
    return RawJSON(orjson.dumps(_fresh(orjson.loads(value), endpoint)))


async def replay_stream(value: bytes, endpoint: str, include_usage: bool) -> AsyncIterator[Answer]:
    stored = _fresh(orjson.loads(value), endpoint)
    head = {k: stored[k] for k in ("id", "created", "model") if k in stored}
    if stored.get("system_fingerprint"):
        head["system_fingerprint"] = stored["system_fingerprint"]
    chunk_object = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    for choice in stored.get("choices", []):
        for delta in _deltas(choice, endpoint):
            yield RawJSON(orjson.dumps({**head, "object": chunk_object, "choices": [delta]}))
    if include_usage and stored.get("usage") is not None:
        usage_chunk = {**head, "object": chunk_object, "choices": [], "usage": stored["usage"]}
        yield RawJSON(orjson.dumps(usage_chunk))


def _deltas(choice: dict[str, Any], endpoint: str) -> list[dict[str, Any]]:
    index = choice.get("index", 0)
    finish = {"index": index, "finish_reason": choice.get("finish_reason") or "stop"}
    if endpoint != "chat":
        text = {"index": index, "text": choice.get("text", ""), "finish_reason": None}
        return [text, {**finish, "text": ""}]
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    return [{"index": index, "delta": delta, "finish_reason": None}, {**finish, "delta": {}}]


class StreamAssembler:
    """Builds the whole answer a stream amounts to, chunk by chunk (for storing it)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.is_broken = False  # a chunk that could not be read: do not store

    def add(self, chunk: Answer) -> None:
        try:
            data = orjson.loads(answer_bytes(chunk))
        except orjson.JSONDecodeError:
            self.is_broken = True
            return
        if not isinstance(data, dict) or "error" in data:
            self.is_broken = True
            return
        if not self.head:
            self.head = {k: data[k] for k in ("id", "created", "model") if k in data}
            if data.get("system_fingerprint"):
                self.head["system_fingerprint"] = data["system_fingerprint"]
        if data.get("usage"):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            self._merge(choice)

    def _merge(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        merged = self.choices.setdefault(index, {"index": index, "text": "", "tool_calls": {}})
        if choice.get("finish_reason"):
            merged["finish_reason"] = choice["finish_reason"]
        if self.endpoint != "chat":
            merged["text"] += choice.get("text") or ""
            return
        delta = choice.get("delta") or {}
        merged["text"] += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            slot = merged["tool_calls"].setdefault(
                call.get("index", 0), {"type": "function", "function": {"arguments": ""}}
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["function"]["name"] = function["name"]
            slot["function"]["arguments"] += function.get("arguments") or ""

    def whole(self) -> bytes | None:
        """The whole answer's JSON; None when the stream was cut or unreadable."""
        if self.is_broken or not self.choices:
            return None
        if any("finish_reason" not in c for c in self.choices.values()):
            return None  # cut short: nothing to replay faithfully
        choices = [self._choice(self.choices[i]) for i in sorted(self.choices)]
        kind = "chat.completion" if self.endpoint == "chat" else "text_completion"
        whole = {**self.head, "object": kind, "choices": choices, "usage": self.usage}
        return orjson.dumps(whole)

    def _choice(self, merged: dict[str, Any]) -> dict[str, Any]:
        if self.endpoint != "chat":
            return {
                "index": merged["index"],
                "text": merged["text"],
                "finish_reason": merged["finish_reason"],
            }
        message: dict[str, Any] = {"role": "assistant", "content": merged["text"] or None}
        if merged["tool_calls"]:
            message["tool_calls"] = [merged["tool_calls"][i] for i in sorted(merged["tool_calls"])]
        elif message["content"] is None:
            message["content"] = ""
        return {
            "index": merged["index"],
            "message": message,
            "finish_reason": merged["finish_reason"],
        }
