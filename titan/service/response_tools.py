"""The Responses API's tools as the chat completion's: function tools (``{"type": "function",
"name", "parameters", ...}``) become chat tools (``{"type": "function", "function": {...}}``),
``tool_choice`` and ``parallel_tool_calls`` follow; ``file_search`` tools stay with the service,
which runs the search itself. The backend's 400s about a chat tool are renamed to the Responses
field they came from."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from titan.errors import InvalidRequestError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")
_MODES = ("none", "auto", "required")
# "tools[2].function.parameters" in a chat completion's error.
_CHAT_TOOL_PARAM = re.compile(r"tools\[(\d+)\](?:\.function)?")


@dataclass(frozen=True)
class ToolPlan:
    """What the chat completion gets (``chat``: its tools, tool_choice, parallel_tool_calls),
    the file_search tools the service runs, and where each chat tool sits in ``tools``."""

    chat: dict[str, Any] = field(default_factory=dict)
    file_search: list[dict[str, Any]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def renamed(self, error: InvalidRequestError) -> InvalidRequestError:
        """``error`` with the chat tool's parameter written as the Responses one
        (``tools[0].function.parameters`` → ``tools[2].parameters``)."""

        def rename(match: re.Match[str]) -> str:
            index = int(match.group(1))
            return f"tools[{self.positions[index] if index < len(self.positions) else index}]"

        if error.param and error.param.startswith("tools["):
            error.param = _CHAT_TOOL_PARAM.sub(rename, error.param, count=1)
            error.message = _CHAT_TOOL_PARAM.sub(rename, error.message)
            error.args = (error.message,)
        return error


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param)


def _function(tool: Mapping[str, Any], index: int) -> dict[str, Any]:
    param = f"tools[{index}]"
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            f"{param}.name",
            "a function needs a 'name' of 1 to 64 letters, digits, underscores or dashes.",
        )
    if tool.get("description") is not None and not isinstance(tool["description"], str):
        raise _bad(f"{param}.description", "must be a string.")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], Mapping):
        raise _bad(f"{param}.parameters", "must be a JSON Schema object.")
    if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
        raise _bad(f"{param}.strict", "must be a boolean.")
    function = {key: tool[key] for key in _FUNCTION_KEYS if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _file_search(tool: Mapping[str, Any], index: int) -> dict[str, Any]:
    ids = tool.get("vector_store_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise _bad(f"tools[{index}].vector_store_ids", "it must list vector store ids.")
    return dict(tool)


def _chosen(
    choice: Any, functions: list[dict[str, Any]], has_file_search: bool
) -> tuple[Any, list[dict[str, Any]]]:
    """(the chat tool_choice, the chat tools it leaves) for the Responses ``tool_choice``."""
    names = [tool["function"]["name"] for tool in functions]
    if choice is None or choice in _MODES:
        if choice == "required" and not functions and not has_file_search:
            raise _bad("tool_choice", "'required' needs 'tools'.")
        return (choice if functions else None), functions
    if not isinstance(choice, Mapping):
        raise _bad("tool_choice", "use 'none', 'auto', 'required' or an object naming a tool.")
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise _bad("tool_choice", f"no function named {name!r} is among 'tools'.")
        return {"type": "function", "function": {"name": name}}, functions
    if kind == "file_search":
        if not has_file_search:
            raise _bad("tool_choice", "no file_search tool is among 'tools'.")
        return ("none" if functions else None), functions  # the search always runs
    if kind == "allowed_tools":
        mode, allowed = choice.get("mode"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise _bad(
                "tool_choice",
                "allowed_tools needs a 'mode' (auto or required) and a list of 'tools'.",
            )
        kept_names = {
            t.get("name") for t in allowed if isinstance(t, Mapping) and t.get("type") == "function"
        }
        unknown = sorted(str(n) for n in kept_names if n not in names)
        if unknown:
            raise _bad("tool_choice", f"no function named {unknown[0]!r} is among 'tools'.")
        kept = [tool for tool in functions if tool["function"]["name"] in kept_names]
        searches = any(isinstance(t, Mapping) and t.get("type") == "file_search" for t in allowed)
        if mode == "required" and not kept and not (searches and has_file_search):
            raise _bad("tool_choice", "allowed_tools 'required' allows no tool of 'tools'.")
        return (mode if kept else None), kept
    raise _bad(
        "tool_choice",
        f"tool_choice of type {kind!r} is not supported (function, "
        "file_search and allowed_tools are).",
    )


def plan_tools(tools: Sequence[Mapping[str, Any]], choice: Any, parallel: bool) -> ToolPlan:
    """Raises InvalidRequestError naming ``tools[i]...`` or ``tool_choice``."""
    functions: list[dict[str, Any]] = []
    positions: list[int] = []
    searches: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            functions.append(_function(tool, index))
            positions.append(index)
        elif kind == "file_search":
            searches.append(_file_search(tool, index))
        else:
            raise InvalidRequestError(
                f"Unsupported tool {kind!r} in 'tools[{index}]': /v1/responses supports "
                "function and file_search tools.",
                param=f"tools[{index}]",
            )
    names = [tool["function"]["name"] for tool in functions]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _bad("tools", f"function names must be unique; {duplicates[0]!r} repeats.")
    chat_choice, kept = _chosen(choice, functions, bool(searches))
    chat: dict[str, Any] = {}
    if kept:
        chat = {"tools": kept, "parallel_tool_calls": parallel}
        if chat_choice is not None:
            chat["tool_choice"] = chat_choice
    kept_positions = [positions[functions.index(tool)] for tool in kept]
    return ToolPlan(chat, searches, kept_positions)
