"""A whole reply of the embedded model read as OpenAI tool calls.

``auto``: each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block naming a known
tool with an object of arguments becomes a call; a block with invalid JSON or an unknown name
stays in the content, as written (nothing the model said is lost). ``required``/``named``: the
output was constrained to JSON (tools.forced_call_constraint) and is read directly.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from titan.backends.embedded.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolPlan
from titan.protocol.chat import ChatMessage, ToolCall, ToolCallFunction


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def make_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=new_call_id(), function=ToolCallFunction(name=name, arguments=arguments))


def call_from_object(value: Any, tool_names: set[str]) -> ToolCall | None:
    """{"name": known tool, "arguments": {...}} (also "parameters", Llama's key, or the
    arguments as JSON text) as a call; None when it is not one."""
    if not isinstance(value, dict) or value.get("name") not in tool_names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return make_call(value["name"], json.dumps(arguments, ensure_ascii=False))


def call_from_block(body: str, tool_names: set[str]) -> ToolCall | None:
    """The JSON between the markers of one block, as a call, or None."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return call_from_object(value, tool_names)


def parse_marked_calls(
    text: str, tool_names: set[str], max_calls: int | None
) -> tuple[str | None, list[ToolCall]]:
    """The content left once the valid call blocks are taken out (None if nothing is), and the
    calls in order. An unclosed block at the very end counts if its JSON is whole (the model
    stopped at EOS right after the object). Beyond ``max_calls`` blocks stay in the content."""
    calls: list[ToolCall] = []
    content_parts: list[str] = []
    position = 0
    while (start := text.find(TOOL_CALL_OPEN, position)) != -1:
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        body_end = len(text) if end == -1 else end
        block_end = len(text) if end == -1 else end + len(TOOL_CALL_CLOSE)
        call = None
        if max_calls is None or len(calls) < max_calls:
            call = call_from_block(text[body_start:body_end], tool_names)
        content_parts.append(text[position:start])
        if call is None:
            content_parts.append(text[start:block_end])
        else:
            # Whitespace before a call separates it from the text: not content (the stream
            # drops it the same way).
            content_parts = ["".join(content_parts).rstrip()]
            calls.append(call)
        position = block_end
    content_parts.append(text[position:])
    content = "".join(content_parts)
    if not calls:
        return content, calls
    return content.rstrip() or None, calls


def parse_forced_calls(text: str, plan: ToolPlan) -> list[ToolCall]:
    """The constrained output read as calls. "named": the output is the arguments, as
    generated (cut short if max_tokens cut it, as OpenAI's are: finish_reason says "length"),
    so the streamed fragments add up to the same text. "required": [] unless whole JSON."""
    if plan.mode == "named":
        return [make_call(plan.forced_name or "", text)]
    try:
        value = json.loads(text)
    except ValueError:
        return []
    names = {tool["function"]["name"] for tool in plan.tools}
    items = value if isinstance(value, list) else [value]
    calls, seen = [], set()
    for item in items:
        call = call_from_object(item, names)
        if call is None:
            continue
        key = (call.function.name, call.function.arguments)
        if key in seen:  # a small model repeats a call: the first is the call, the rest noise
            break
        seen.add(key)
        calls.append(call)
    return calls[: plan.max_calls] if plan.max_calls else calls


def tool_finish_reason(reason: str | None, has_calls: bool, is_forced: bool = False) -> str | None:
    """OpenAI's "tool_calls" when the model stopped after calling; "length" stays "length",
    except for a forced call, whose JSON is read only when whole (the engine closes it before
    max_tokens runs out)."""
    if has_calls and (reason == "stop" or (is_forced and reason == "length")):
        return "tool_calls"
    return reason


def choice_message(plan: ToolPlan, text: str, reason: str | None) -> tuple[ChatMessage, str | None]:
    """A finished choice's message and finish reason under the request's tool plan."""
    if plan.mode == "none":
        return ChatMessage(content=text), reason
    if plan.mode == "auto":
        names = {tool["function"]["name"] for tool in plan.tools}
        content, calls = parse_marked_calls(text, names, plan.max_calls)
    else:
        calls = parse_forced_calls(text, plan)
        content = None if calls else text
    message = ChatMessage(content=content, tool_calls=calls or None)
    return message, tool_finish_reason(reason, bool(calls), is_forced=plan.is_forced)
