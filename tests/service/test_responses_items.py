"""The Responses API's items and the stored conversation: input items become chat messages
that keep their ids, tool calls and results included; the stored messages give back the chat
prompt, the counted messages and the items that input_items lists, paged as OpenAI pages."""

from __future__ import annotations

import pytest

from titan.errors import InvalidRequestError
from titan.service.response_items import (
    answer_message,
    counted_messages,
    function_call_item,
    input_messages,
    items_page,
    message_item,
    newest_user_text,
    prompt_messages,
    stored_items,
)

# What openai-agents sends on its second turn of a tool loop: the user's question, the call it
# got back (an output item, replayed whole) and the call's result.
AGENT_TURN = [
    {"content": "What is 2 plus 3?", "role": "user"},
    {
        "arguments": '{"a": 2, "b": 3}',
        "call_id": "call_1",
        "name": "add",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
    },
    {"call_id": "call_1", "output": "5", "type": "function_call_output"},
]


def test_a_tool_loop_turn_becomes_chat_history_with_its_ids():
    messages = input_messages(AGENT_TURN)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert prompt_messages(messages) == [
        {"role": "user", "content": "What is 2 plus 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    items = stored_items(messages, "resp_x")
    assert [item["type"] for item in items] == ["message", "function_call", "function_call_output"]
    assert items[0]["content"] == [{"type": "input_text", "text": "What is 2 plus 3?"}]
    assert items[0]["id"].startswith("msg_")
    assert items[1] == function_call_item("fc_1", "call_1", "add", '{"a": 2, "b": 3}')
    assert items[2]["call_id"] == "call_1" and items[2]["output"] == "5"
    assert items[2]["id"].startswith("fco_")
    # The file_search query is the question, not the tool's result.
    assert newest_user_text(messages) == "What is 2 plus 3?"


def test_an_assistant_message_and_the_calls_after_it_are_one_chat_turn():
    messages = input_messages(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_a",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "sunny"}],
            },
            {"type": "function_call_output", "call_id": "c2", "output": "rain"},
            {"type": "reasoning", "id": "rs_1", "summary": []},  # replayed, skipped
        ]
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Checking." and len(messages[1]["tool_calls"]) == 2
    assert messages[2]["content"] == "sunny"
    items = stored_items(messages, "resp_x")
    assert [i["type"] for i in items] == [
        "message",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert items[1]["id"] == "msg_a" and items[1]["role"] == "assistant"


def test_roles_and_developer_messages():
    messages = input_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        ]
    )
    assert stored_items(messages, "resp_x")[0]["role"] == "developer"
    assert prompt_messages(messages)[0] == {"role": "system", "content": "Be brief."}
    assert input_messages("Hi")[0]["content"] == "Hi"


@pytest.mark.parametrize(
    ("bad_input", "param"),
    [
        ([], "input"),
        (7, "input"),
        (["hi"], "input[0]"),
        ([{"role": "robot", "content": "x"}], "input[0].role"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0]",
        ),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        (
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}],
            "input[0].arguments",
        ),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
        ([{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
        ([{"type": "reasoning", "summary": []}], "input"),
    ],
)
def test_bad_input_is_a_400_naming_the_item(bad_input, param):
    with pytest.raises(InvalidRequestError) as raised:
        input_messages(bad_input)
    assert raised.value.param == param


def test_an_answer_is_stored_with_the_ids_of_its_output_items():
    output = [
        message_item("msg_o", "Let me add."),
        function_call_item("fc_o", "call_o", "add", '{"a": 1}'),
    ]
    stored = answer_message(output)
    assert stored["content"] == "Let me add." and stored["id"] == "msg_o"
    assert stored["tool_calls"][0]["item_id"] == "fc_o"
    assert stored_items([stored], "resp_x") == output
    only_calls = answer_message(output[1:])
    assert only_calls["content"] is None and "id" not in only_calls
    assert stored_items([only_calls], "resp_x") == output[1:]


def test_messages_stored_before_items_had_ids_get_stable_ones():
    old = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    first, second = stored_items(old, "resp_abc"), stored_items(old, "resp_abc")
    assert first == second and first[0]["id"] == "msg_abc_0" and first[1]["id"] == "msg_abc_1"


def test_counted_messages_are_plain_text_with_the_tools_described():
    messages = input_messages(AGENT_TURN)
    counted = counted_messages(messages, tools=[{"type": "function", "function": {"name": "add"}}])
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in counted)
    assert counted[0]["role"] == "system" and '"add"' in counted[0]["content"]
    assert "<tool_call>" in counted[2]["content"] and "<tool_response>" in counted[3]["content"]
    # A plain conversation is counted as it is sent: what makes trimming's count exact.
    plain = [{"role": "user", "content": "Hi", "id": "msg_1"}]
    assert counted_messages(plain) == prompt_messages(plain) == [{"role": "user", "content": "Hi"}]


def test_items_page_orders_pages_and_checks_its_parameters():
    items = [{"id": f"i{n}"} for n in range(5)]
    page = items_page(items)
    assert [i["id"] for i in page["data"]] == ["i4", "i3", "i2", "i1", "i0"]
    assert page["first_id"] == "i4" and page["last_id"] == "i0" and not page["has_more"]
    first = items_page(items, order="asc", limit=2)
    assert [i["id"] for i in first["data"]] == ["i0", "i1"] and first["has_more"]
    rest = items_page(items, order="asc", limit=2, after=first["last_id"])
    assert [i["id"] for i in rest["data"]] == ["i2", "i3"] and rest["has_more"]
    last = items_page(items, order="asc", limit=2, after="i3")
    assert [i["id"] for i in last["data"]] == ["i4"] and not last["has_more"]
    for kwargs, param in [
        ({"order": "up"}, "order"),
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"after": "nope"}, "after"),
    ]:
        with pytest.raises(InvalidRequestError) as raised:
            items_page(items, **kwargs)
        assert raised.value.param == param
