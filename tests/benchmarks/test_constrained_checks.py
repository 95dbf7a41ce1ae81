"""The constrained-output benchmark's judges (benchmarks/constrained.py): what counts as a whole,
valid answer and what does not, so a 100% there means what it says."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks.constrained import LARGEST_BUDGET, budgets, check_schema_reply, check_tool_reply

ENTRY = {
    "id": "x",
    "schema": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}, "n": {"type": "integer"}},
        "required": ["day"],
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {
        "type": "object", "properties": {}}}},
]  # fmt: skip


def call(name: str, arguments: dict | str) -> SimpleNamespace:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return SimpleNamespace(function=SimpleNamespace(name=name, arguments=text))


def message(*calls: SimpleNamespace, content: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(tool_calls=list(calls) or None, content=content)


def test_budgets_run_from_the_minimum_to_the_largest():
    assert budgets(20) == [20, 21, 28, 40, 128, LARGEST_BUDGET]
    assert budgets(300) == [300, 301, 308, LARGEST_BUDGET]
    assert budgets(LARGEST_BUDGET) == [LARGEST_BUDGET]


def test_a_schema_reply_counts_only_whole_valid_and_stopped():
    assert check_schema_reply(ENTRY, '{"day": "2024-02-29", "n": 3}', "stop") is None
    assert check_schema_reply(ENTRY, '{"day": "2024-02-29"}', "length") == "finish_reason length"
    assert check_schema_reply(ENTRY, '{"day": "2024-02-', "stop") == "not JSON"
    assert "required" in check_schema_reply(ENTRY, '{"n": 3}', "stop")
    # Formats are checked: year 0000 is not a date to Python's validator.
    assert "date" in check_schema_reply(ENTRY, '{"day": "0000-01-01"}', "stop")


def test_a_tool_reply_counts_only_as_the_contract_says():
    required = {"tool_choice": "required", "parallel_tool_calls": True}
    single = {"tool_choice": "required", "parallel_tool_calls": False}
    named = {"tool_choice": {"type": "function", "function": {"name": "now"}},
             "parallel_tool_calls": True}  # fmt: skip
    good = message(call("add", {"a": 1}), call("now", {}))
    assert check_tool_reply(required, TOOLS, good, "tool_calls") is None
    assert check_tool_reply(required, TOOLS, good, "length") is not None
    assert check_tool_reply(required, TOOLS, message(content='[{"name": "add"'), "stop")
    assert (
        check_tool_reply(single, TOOLS, good, "tool_calls")
        == "2 calls with parallel_tool_calls false"
    )
    assert check_tool_reply(named, TOOLS, message(call("add", {"a": 1})), "tool_calls")
    assert "invalid" in check_tool_reply(
        required, TOOLS, message(call("add", {"a": "1"})), "tool_calls"
    )
    assert check_tool_reply(required, TOOLS, message(call("add", '{"a": 1')), "tool_calls")
    assert check_tool_reply(required, TOOLS, message(call("sub", {})), "tool_calls")
