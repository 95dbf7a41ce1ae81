"""A Responses request's tools, tool_choice, include and text.format as the chat completion's,
and 400s that name the Responses parameter."""

from __future__ import annotations

import pytest

from titan.errors import InvalidRequestError
from titan.service.response_body import chat_options, output_logprobs, parse_body
from titan.service.response_tools import plan_tools

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "strict": True,
}
MUL = {"type": "function", "name": "mul", "parameters": None, "strict": None}
SEARCH = {"type": "file_search", "vector_store_ids": ["vs_1"]}


def test_function_tools_become_chat_tools():
    plan = plan_tools([SEARCH, ADD, MUL], None, True)
    assert plan.chat == {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": ADD["parameters"],
                    "strict": True,
                },
            },
            {"type": "function", "function": {"name": "mul"}},
        ],
        "parallel_tool_calls": True,
    }
    assert plan.file_search == [SEARCH] and plan.positions == [1, 2]
    assert plan_tools([SEARCH], None, True).chat == {}  # the search is the service's own


@pytest.mark.parametrize(
    ("choice", "chat_choice", "names"),
    [
        ("auto", "auto", ["add", "mul"]),
        ("none", "none", ["add", "mul"]),
        ("required", "required", ["add", "mul"]),
        (
            {"type": "function", "name": "mul"},
            {"type": "function", "function": {"name": "mul"}},
            ["add", "mul"],
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "mul"}],
            },
            "required",
            ["mul"],
        ),
        ({"type": "file_search"}, "none", ["add", "mul"]),
    ],
)
def test_tool_choice_becomes_the_chat_one(choice, chat_choice, names):
    plan = plan_tools([ADD, MUL, SEARCH], choice, False)
    assert plan.chat["tool_choice"] == chat_choice
    assert [tool["function"]["name"] for tool in plan.chat["tools"]] == names
    assert plan.chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "web_search"}], None, "tools[0]"),
        ([ADD, {"type": "function", "name": "bad name"}], None, "tools[1].name"),
        ([{**ADD, "parameters": "{}"}], None, "tools[0].parameters"),
        ([{**ADD, "strict": "yes"}], None, "tools[0].strict"),
        ([ADD, ADD], None, "tools"),
        ([{"type": "file_search"}], None, "tools[0].vector_store_ids"),
        ([ADD], {"type": "function", "name": "mul"}, "tool_choice"),
        ([ADD], {"type": "function", "function": {"name": "add"}}, "tool_choice"),
        ([ADD], {"type": "web_search_preview"}, "tool_choice"),
        ([ADD], {"type": "file_search"}, "tool_choice"),
        ([ADD], "sometimes", "tool_choice"),
        ([], "required", "tool_choice"),
        ([ADD], {"type": "allowed_tools", "mode": "required", "tools": []}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s_naming_the_parameter(tools, choice, param):
    with pytest.raises(InvalidRequestError) as raised:
        plan_tools(tools, choice, True)
    assert raised.value.param == param


def test_a_chat_tool_error_names_the_responses_tool():
    plan = plan_tools([SEARCH, ADD], None, True)
    error = InvalidRequestError(
        "Invalid value for 'tools[0].function.parameters': not a valid JSON Schema.",
        param="tools[0].function.parameters",
    )
    renamed = plan.renamed(error)
    assert renamed.param == "tools[1].parameters"
    assert "'tools[1].parameters'" in renamed.message


def test_include_text_format_and_logprobs_reach_the_chat_completion():
    body = parse_body(
        {
            "input": "x",
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
            "top_logprobs": 2,
            "max_output_tokens": 9,
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "n",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        }
    )
    assert chat_options(body) == {
        "max_tokens": 9,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True},
        },
        "logprobs": True,
        "top_logprobs": 2,
    }
    assert chat_options(
        parse_body({"input": "x", "text": {"format": {"type": "json_object"}}})
    ) == {"response_format": {"type": "json_object"}}
    assert chat_options(parse_body({"input": "x", "top_logprobs": 2})) == {}


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"include": ["message.output_text.everything"]}, "include"),
        ({"include": "file_search_call.results"}, "include"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_fields_are_400s_naming_them(data, param):
    with pytest.raises(InvalidRequestError) as raised:
        chat_options(parse_body({"input": "x", **data}))
    assert raised.value.param == param


def test_chat_logprobs_become_output_text_logprobs():
    chat = {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.5,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": None}],
            }
        ]
    }
    assert output_logprobs(chat) == [
        {
            "token": "Hi",
            "bytes": [72, 105],
            "logprob": -0.5,
            "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}],
        }
    ]
    assert output_logprobs(None) == []


def test_null_means_the_default_as_at_openai():
    body = parse_body({"input": "x", "store": None, "stream": None, "parallel_tool_calls": None,
                       "metadata": None, "tools": None, "text": None})  # fmt: skip
    assert body.store and not body.stream and body.parallel_tool_calls and body.tools == []
