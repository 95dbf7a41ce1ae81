"""The Responses API's items and the chat messages a conversation is stored as.

A stored conversation is a list of chat messages that carry their items' ids:
``{"role": "user"|"system"|"developer"|"assistant", "content", "id"}``; an assistant turn that
called tools has ``tool_calls`` (each with its ``fc_`` item id as ``item_id``) and its text's
``id`` only when it had text; a tool result is ``{"role": "tool", "tool_call_id", "content",
"id"}``. From it come the chat completion's messages (``prompt_messages``), the messages that
trimming counts (``counted_messages``) and the items that GET .../input_items lists
(``stored_items``); ``input_messages`` builds it from a request's ``input``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from titan.errors import InvalidRequestError
from titan.protocol.common import list_object

Message = dict[str, Any]
Item = dict[str, Any]
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")
# Input items that carry nothing a chat model reads: what a client replays from an earlier
# output (the search already shaped that answer; Titan's models do not reason in items).
_SKIPPED = ("file_search_call", "reasoning")
MAX_ITEMS_PAGE = 100


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ---- input items → stored messages ----------------------------------------------------------


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid '{param}': {message}", param=param)


def _text(content: Any, param: str, *, parts: Sequence[str] = _TEXT_PARTS) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in (*parts, "refusal"):
                raise _bad(f"{param}[{index}]", "only text parts are supported.")
            texts.append(str(part.get("refusal" if part["type"] == "refusal" else "text", "")))
        return "".join(texts)
    raise _bad(param, "give a string or text parts.")


def _string(item: Mapping[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{param}.{key}", "must be a string.")
    return value


def _open_call_turn(messages: list[Message]) -> Message:
    """The assistant message a function_call item joins: the one just before it (text or
    calls), or a new one."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", [])
        return last
    turn: Message = {"role": "assistant", "content": None, "tool_calls": []}
    messages.append(turn)
    return turn


def input_messages(input_value: Any) -> list[Message]:
    """The Responses API's ``input`` (a string, or items: messages, function_call and
    function_call_output) as stored messages; 400 naming ``input[i]...`` when it is not."""
    if isinstance(input_value, str):
        return [{"role": "user", "content": input_value, "id": new_item_id("msg")}]
    if not isinstance(input_value, list) or not input_value:
        raise InvalidRequestError(
            "Invalid 'input': give a string or a non-empty list of items.", param="input"
        )
    messages: list[Message] = []
    for index, item in enumerate(input_value):
        param = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise _bad(param, "each item must be an object.")
        kind = item.get("type", "message")
        item_id = item.get("id") if isinstance(item.get("id"), str) else None
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(
                    f"{param}.role",
                    f"{role!r} is not a role: use user, assistant, system or developer.",
                )
            text = _text(item.get("content"), f"{param}.content")
            messages.append({"role": role, "content": text, "id": item_id or new_item_id("msg")})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
                "item_id": item_id or new_item_id("fc"),
            }
            _open_call_turn(messages)["tool_calls"].append(call)
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"{param}.output", parts=("input_text",))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", param),
                    "content": output,
                    "id": item_id or new_item_id("fco"),
                }
            )
        elif kind not in _SKIPPED:
            raise _bad(
                f"{param}.type",
                f"{kind!r} items are not supported (message, "
                "function_call and function_call_output are).",
            )
    if not messages:
        raise _bad("input", "no message or function call among the items.")
    return messages


# ---- stored messages → the chat completion, trimming, summaries ----------------------------


def _calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {"id": call["id"], "type": "function", "function": dict(call["function"])}
        for call in message.get("tool_calls") or ()
    ]


def prompt_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """The chat completion's messages (ids left out; "developer" written as "system", which
    every chat template knows)."""
    prompt: list[Message] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            prompt.append(
                {
                    "role": "tool",
                    "tool_call_id": message["tool_call_id"],
                    "content": message["content"],
                }
            )
            continue
        entry: Message = {
            "role": "system" if role == "developer" else role,
            "content": message.get("content"),
        }
        if message.get("tool_calls"):
            entry["tool_calls"] = _calls(message)
        elif entry["content"] is None:
            entry["content"] = ""
        prompt.append(entry)
    return prompt


def _call_text(call: Mapping[str, Any]) -> str:
    function = call["function"]
    body = json.dumps({"name": function["name"], "arguments": function["arguments"]})
    return f"<tool_call>\n{body}\n</tool_call>"


def counted_messages(
    messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[Message]:
    """Plain role and text messages for a token counter (a chat template may not take tool
    turns): calls and results written as the Hermes blocks the embedded backend renders, and
    the ``tools`` the model is told about (chat format) as a system message, one per line."""
    counted: list[Message] = []
    if tools:
        described = "\n".join(json.dumps(tool) for tool in tools)
        counted.append({"role": "system", "content": f"# Tools\n<tools>\n{described}\n</tools>"})
    for message in messages:
        role = message["role"]
        text = message.get("content") or ""
        if role == "tool":
            counted.append(
                {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
            )
            continue
        calls = [_call_text(call) for call in message.get("tool_calls") or ()]
        if calls:
            text = "\n".join([text, *calls] if text else calls)
        counted.append({"role": "system" if role == "developer" else role, "content": text})
    return counted


def transcript_line(message: Mapping[str, Any]) -> str:
    """One message for a summary's transcript."""
    counted = counted_messages([message])[0]
    role = "tool" if message["role"] == "tool" else counted["role"]
    return f"{role}: {counted['content']}"


def newest_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """What file_search looks up: the newest user message (a tool result is not a question)."""
    for message in reversed(messages):
        if message["role"] == "user":
            return str(message.get("content") or "")
    return str(messages[-1].get("content") or "") if messages else ""


# ---- output items ---------------------------------------------------------------------------


def message_item(
    item_id: str,
    text: str,
    *,
    status: str = "completed",
    annotations: list[dict[str, Any]] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> Item:
    part = {
        "type": "output_text",
        "text": text,
        "annotations": annotations or [],
        "logprobs": logprobs or [],
    }
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> Item:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def answer_message(output: Sequence[Mapping[str, Any]]) -> Message:
    """The stored assistant message of a response's output items (its text and calls)."""
    message: Message = {"role": "assistant", "content": None}
    calls = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part.get("text", "") for part in item["content"])
            message["content"] = (message["content"] or "") + text
            message.setdefault("id", item["id"])
        elif item["type"] == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "item_id": item["id"],
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message


# ---- stored messages → listed items ---------------------------------------------------------


def stored_items(messages: Sequence[Mapping[str, Any]], response_id: str) -> list[Item]:
    """The items of stored messages, oldest first. Messages stored before items had ids get
    ids made from the response's and their position (the same on every read)."""
    items: list[Item] = []
    for index, message in enumerate(messages):
        role = message["role"]
        fallback = f"{response_id.removeprefix('resp_')}_{index}"
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "id": message.get("id") or f"fco_{fallback}",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                    "status": "completed",
                }
            )
            continue
        text = message.get("content")
        if role != "assistant":
            items.append(
                {
                    "type": "message",
                    "id": message.get("id") or f"msg_{fallback}",
                    "role": role,
                    "status": "completed",
                    "content": [{"type": "input_text", "text": text or ""}],
                }
            )
            continue
        if text or not message.get("tool_calls"):
            items.append(message_item(message.get("id") or f"msg_{fallback}", text or ""))
        for number, call in enumerate(message.get("tool_calls") or ()):
            item_id = call.get("item_id") or f"fc_{fallback}_{number}"
            function = call["function"]
            items.append(
                function_call_item(item_id, call["id"], function["name"], function["arguments"])
            )
    return items


def items_page(
    items: Sequence[Item], *, order: str = "desc", after: str | None = None, limit: int = 20
) -> dict[str, Any]:
    """OpenAI's list of items: newest first unless ``order`` is "asc", from just after the item
    ``after``, ``limit`` (1 to 100) at most."""
    if order not in ("asc", "desc"):
        raise InvalidRequestError("Invalid 'order': use 'asc' or 'desc'.", param="order")
    if not 1 <= limit <= MAX_ITEMS_PAGE:
        raise InvalidRequestError(
            f"Invalid 'limit': it must be between 1 and {MAX_ITEMS_PAGE}.", param="limit"
        )
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise InvalidRequestError(
                f"Invalid 'after': no item '{after}' among this response's input items.",
                param="after",
            )
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return list_object(data, has_more=len(ordered) > limit)
