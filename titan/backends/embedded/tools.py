"""Tool calling for the embedded model: the request's tools checked, and the prompt built.

Where the model's chat template reads ``tools`` (HF's convention), the tools, the assistant
turns' ``tool_calls`` and the ``tool`` results go to the template as HF passes them. Otherwise
(SmolLM2's template, ChatML) the tools are described in a system message in the Hermes/Qwen
format, calls in the history are written as ``<tool_call>{...}</tool_call>`` and results as
``<tool_response>...</tool_response>`` in a user turn: the format the reply is parsed in
(titan/backends/embedded/tool_parser.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from titan.engine.sampling_params import StructuredOutput
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# OpenAI's rule for function names.
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# A tool without parameters takes an empty object (closed: a forced call must end).
_EMPTY_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}

TOOLS_SYSTEM_BLOCK = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request asks of tools. mode: "none" (never rendered nor parsed), "auto"
    (parsed if the model calls), "required" or "named" (forced by constrained decoding)."""

    mode: str
    tools: tuple[dict[str, Any], ...]  # each {"type": "function", "function": {...}}, checked
    forced_name: str | None = None
    is_parallel: bool = True
    max_parallel_calls: int = 8  # "required" with parallel calls: the most a reply may hold

    @property
    def is_forced(self) -> bool:
        """Constrained to calls: the reply is read as calls only, never as content."""
        return self.mode in ("required", "named")

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        """Each tool's parameters schema, by name."""
        return {
            tool["function"]["name"]: tool["function"].get("parameters") or _EMPTY_PARAMETERS
            for tool in self.tools
        }

    @property
    def max_calls(self) -> int | None:
        return self.max_parallel_calls if self.is_parallel else 1


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param)


def _checked_tool(tool: Any, index: int) -> dict[str, Any]:
    param = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise _bad(param, "each tool must be an object.")
    if tool.get("type", "function") != "function":
        raise _bad(f"{param}.type", "only tools of type 'function' are supported.")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{param}.function", "a tool needs a 'function' object.")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            f"{param}.function.name",
            "a function needs a 'name' of 1 to 64 letters, digits, underscores or dashes.",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{param}.function.description", "must be a string.")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise _bad(f"{param}.function.parameters", "must be a JSON Schema object.")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            raise _bad(
                f"{param}.function.parameters", f"not a valid JSON Schema: {exc.message}"
            ) from exc
    return {"type": "function", "function": function}


def tool_plan(request: ChatCompletionRequest, max_parallel_calls: int = 8) -> ToolPlan:
    """Raises InvalidRequestError naming the parameter on bad tools or tool_choice."""
    tools = tuple(_checked_tool(tool, i) for i, tool in enumerate(request.tools or ()))
    names = [tool["function"]["name"] for tool in tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise _bad("tools", f"function names must be unique; '{duplicates[0]}' repeats.")
    choice = request.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    is_parallel = request.parallel_tool_calls is not False
    limits = {"is_parallel": is_parallel, "max_parallel_calls": max_parallel_calls}
    if choice == "none":
        return ToolPlan("none", tools, **limits)
    if not tools:
        raise _bad("tool_choice", "'tool_choice' is only allowed when 'tools' are specified.")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise _bad(
                "tool_choice",
                'expected {"type": "function", "function": {"name": ...}} to name a tool.',
            )
        if name not in names:
            raise _bad("tool_choice", f"no tool named '{name}' is among 'tools'.")
        return ToolPlan("named", tools, forced_name=name, **limits)
    return ToolPlan(choice, tools, **limits)


# ---- the prompt -----------------------------------------------------------------------------


def _arguments_object(arguments: Any) -> Any:
    """OpenAI sends arguments as JSON text; templates and the Hermes format want the object."""
    if not isinstance(arguments, str):
        return arguments if arguments is not None else {}
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # written back as it came: the model sees what was said


def _history_calls(message: Any, index: int) -> list[dict[str, Any]]:
    calls = []
    for j, call in enumerate(message.tool_calls or ()):
        param = f"messages[{index}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(f"{param}.function", "a tool call needs a 'function' with a 'name'.")
        arguments = _arguments_object(function.get("arguments"))
        entry = {"name": function["name"], "arguments": arguments}
        calls.append({"id": call.get("id"), "type": "function", "function": entry})
    return calls


def _role(role: str) -> str:
    # Templates written before OpenAI's "developer" role know it as "system".
    return "system" if role == "developer" else role


def _native_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """HF's shape: calls as {"type", "function": {"name", "arguments": object}}, results as
    {"role": "tool", "content", "tool_call_id"}."""
    messages = []
    for index, message in enumerate(request.messages):
        entry: dict[str, Any] = {"role": _role(message.role), "content": message.text}
        if message.name is not None:
            entry["name"] = message.name
        if message.tool_calls:
            entry["tool_calls"] = _history_calls(message, index)
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        messages.append(entry)
    return messages


def _hermes_call(call: dict[str, Any]) -> str:
    body = json.dumps(call["function"], ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _hermes_messages(request: ChatCompletionRequest, plan: ToolPlan) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(request.messages):
        if message.role == "tool":
            result = f"<tool_response>\n{message.text}\n</tool_response>"
            previous = messages[-1] if messages else None
            # Results of parallel calls answer together, in one user turn (as Qwen's template).
            if previous is not None and previous.get("is_tool_results"):
                previous["content"] += "\n" + result
            else:
                messages.append({"role": "user", "content": result, "is_tool_results": True})
            continue
        entry: dict[str, Any] = {"role": _role(message.role), "content": message.text}
        if message.name is not None:
            entry["name"] = message.name
        if message.tool_calls:
            parts = [message.text] if message.text else []
            parts += [_hermes_call(call) for call in _history_calls(message, index)]
            entry["content"] = "\n".join(parts)
        messages.append(entry)
    for entry in messages:
        entry.pop("is_tool_results", None)
    if plan.mode != "none" and plan.tools:
        _add_tools_block(messages, plan)
    return messages


def _add_tools_block(messages: list[dict[str, Any]], plan: ToolPlan) -> None:
    described = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in plan.tools)
    block = TOOLS_SYSTEM_BLOCK.format(tools=described)
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{block}"
    else:
        messages.insert(0, {"role": "system", "content": block})


def render_chat_prompt(tokenizer: Any, request: ChatCompletionRequest, plan: ToolPlan) -> str:
    """The prompt text: the messages (tool turns included) and, unless tool_choice is "none",
    the tools, through the model's template."""
    template = getattr(tokenizer, "chat_template", None)
    if getattr(template, "accepts_tools", False):
        kwargs = {"tools": list(plan.tools)} if plan.mode != "none" and plan.tools else {}
        return tokenizer.apply_chat_template(
            _native_messages(request), add_generation_prompt=True, **kwargs
        )
    return tokenizer.apply_chat_template(
        _hermes_messages(request, plan), add_generation_prompt=True
    )


# ---- forced calls ---------------------------------------------------------------------------


def _closed(parameters: dict[str, Any]) -> dict[str, Any]:
    """The arguments object without properties it does not declare, unless the schema says
    otherwise (OpenAI's strict mode asks the same): a small model forced into an open object
    keeps inventing properties until max_tokens."""
    if "properties" in parameters and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def forced_call_constraint(plan: ToolPlan) -> StructuredOutput | None:
    """For "named": the output is that tool's arguments object (the name is known); for
    "required": an array of {"name", "arguments"} objects, at least one and at most
    ``max_calls`` (one without parallel calls), each the arguments of the tool it names. The
    engine closes the array before max_tokens runs out. None for "auto" and "none"."""
    parameters = {name: _closed(schema) for name, schema in plan.parameters.items()}
    if plan.mode == "named":
        schema: dict[str, Any] = parameters[plan.forced_name or ""]
    elif plan.mode == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, params in parameters.items()
        ]
        item = calls[0] if len(calls) == 1 else {"anyOf": calls}
        schema = {"type": "array", "items": item, "minItems": 1, "maxItems": plan.max_calls}
    else:
        return None
    return StructuredOutput(kind="json_schema", spec=json.dumps(schema), param="tools")
