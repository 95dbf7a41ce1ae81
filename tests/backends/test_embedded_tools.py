"""Tool calls for the embedded model: tools checked, prompts rendered (with the real SmolLM2
template and a tools-aware one), replies parsed whole and streamed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from titan.backends.embedded.tool_parser import choice_message, parse_marked_calls
from titan.backends.embedded.tool_stream import ToolCallStream
from titan.backends.embedded.tools import (
    ToolPlan,
    forced_call_constraint,
    render_chat_prompt,
    tool_plan,
)
from titan.engine.chat_template import ChatTemplate
from titan.engine.config import EngineConfig
from titan.engine.model.loader import resolve_model
from titan.engine.tokenizer import Tokenizer
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
NAMES = {"get_weather", "get_time"}


def request_of(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **body})


def plan_of(**body: Any) -> ToolPlan:
    return tool_plan(request_of(**body))


@pytest.fixture(scope="module")
def smollm_tokenizer() -> Tokenizer:
    hf_dir = resolve_model(None, EngineConfig().resolved_cache_dir() / "models").hf_dir
    return Tokenizer(hf_dir, (2,), 1)


# ---- checking ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": 5}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
    ],
)
def test_bad_tools_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        plan_of(**body)
    assert caught.value.param == param


def test_tool_choice_modes() -> None:
    assert plan_of().mode == "none"
    assert plan_of(tools=[WEATHER]).mode == "auto"
    assert plan_of(tools=[WEATHER], tool_choice="none").mode == "none"
    named = plan_of(
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    assert (named.mode, named.forced_name) == ("named", "get_time")
    assert plan_of(tools=[WEATHER], parallel_tool_calls=False).max_calls == 1


def test_forced_constraints_are_the_calls_json_schema() -> None:
    named = forced_call_constraint(
        plan_of(
            tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
        )
    )
    assert named is not None and named.kind == "json_schema"
    closed = {**WEATHER["function"]["parameters"], "additionalProperties": False}
    assert json.loads(named.spec) == closed
    open_schema = {"type": "object", "properties": {}, "additionalProperties": True}
    tool = {"type": "function", "function": {"name": "f", "parameters": open_schema}}
    kept = forced_call_constraint(
        plan_of(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}})
    )
    assert json.loads(kept.spec) == open_schema  # what the schema says wins
    required = forced_call_constraint(
        plan_of(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    )
    schema = json.loads(required.spec)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [option["properties"]["name"]["const"] for option in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    assert forced_call_constraint(plan_of(tools=[WEATHER])) is None


# ---- rendering --------------------------------------------------------------------------------

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_time", "arguments": "{}"},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:00"},
]


def test_smollm_template_gets_tools_in_a_system_message(smollm_tokenizer: Tokenizer) -> None:
    assert not smollm_tokenizer.chat_template.accepts_tools
    request = request_of(messages=HISTORY, tools=[WEATHER, TIME])
    prompt = render_chat_prompt(smollm_tokenizer, request, tool_plan(request))
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(WEATHER) in prompt
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    # Both results answer in one user turn, then the assistant's turn opens.
    assert prompt.endswith(
        "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n"
        "<tool_response>\n14:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_choice_none_renders_no_tools_but_the_history(smollm_tokenizer: Tokenizer) -> None:
    request = request_of(messages=HISTORY, tools=[WEATHER], tool_choice="none")
    prompt = render_chat_prompt(smollm_tokenizer, request, tool_plan(request))
    assert "# Tools" not in prompt and "<tool_response>" in prompt
    system_first = [{"role": "system", "content": "Be brief."}, *USER]
    request = request_of(messages=system_first, tools=[WEATHER])
    prompt = render_chat_prompt(smollm_tokenizer, request, tool_plan(request))
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


class _TemplateTokenizer:
    def __init__(self, source: str):
        self.chat_template = ChatTemplate(source, {})

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        return self.chat_template.render(messages, add_generation_prompt, **kwargs)


def test_a_template_that_reads_tools_renders_them_itself() -> None:
    source = (
        "{% for t in tools or [] %}TOOL {{ t.function.name }}|{% endfor %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }}"
        " {{ c.function.arguments | tojson }}"
        "{% endfor %}{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}|{% endfor %}"
    )
    request = request_of(messages=HISTORY, tools=[WEATHER])
    prompt = render_chat_prompt(_TemplateTokenizer(source), request, tool_plan(request))
    assert prompt.startswith("TOOL get_weather|user:Weather in Paris?|")
    assert 'CALL get_weather {"city": "Paris"}' in prompt  # arguments as an object
    assert "tool:18 C, sunny (call_1)" in prompt


# ---- parsing ----------------------------------------------------------------------------------


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


PARIS_CALL = _call("get_weather", '{"city": "Paris"}')


def test_parallel_calls_and_the_text_around_them() -> None:
    text = "Let me check.\n" + PARIS_CALL + "\n" + _call("get_time", "{}")
    content, calls = parse_marked_calls(text, NAMES, None)
    assert content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert calls[0].id != calls[1].id


@pytest.mark.parametrize(
    "text",
    [
        _call("unknown_tool", "{}"),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        "No tools needed.",
    ],
)
def test_unknown_tools_and_invalid_json_stay_content(text: str) -> None:
    message, reason = choice_message(plan_of(tools=[WEATHER, TIME]), text, "stop")
    assert (message.content, message.tool_calls, reason) == (text, None, "stop")


def test_an_unclosed_block_at_the_end_counts_when_its_json_is_whole() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}'
    message, reason = choice_message(plan_of(tools=[TIME]), text, "stop")
    assert message.content is None and reason == "tool_calls"
    assert message.tool_calls[0].function.name == "get_time"


def test_without_parallel_calls_only_the_first_is_a_call() -> None:
    text = _call("get_time", "{}") + _call("get_weather", '{"city": "Rome"}')
    message, _ = choice_message(
        plan_of(tools=[WEATHER, TIME], parallel_tool_calls=False), text, "stop"
    )
    assert [c.function.name for c in message.tool_calls] == ["get_time"]
    assert message.content == _call("get_weather", '{"city": "Rome"}')


def test_none_never_parses_and_length_stays_length() -> None:
    text = _call("get_time", "{}")
    message, reason = choice_message(plan_of(tools=[TIME], tool_choice="none"), text, "stop")
    assert message.content == text and message.tool_calls is None and reason == "stop"
    _, reason = choice_message(plan_of(tools=[TIME]), text, "length")
    assert reason == "length"


def test_forced_outputs_are_read_as_json() -> None:
    named = plan_of(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    message, reason = choice_message(named, '{"city": "Oslo"}', "stop")
    assert message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert reason == "tool_calls" and message.content is None
    required = plan_of(tools=[WEATHER, TIME], tool_choice="required")
    text = (
        '[{"name": "get_time", "arguments": {}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    )
    message, _ = choice_message(required, text, "stop")
    assert [c.function.name for c in message.tool_calls] == ["get_time", "get_weather"]


# ---- streaming --------------------------------------------------------------------------------


def _stream(plan: ToolPlan, pieces: list[str]) -> tuple[str, list[dict[str, Any]], list[dict]]:
    """Feed the pieces; the content sent, the calls assembled from the deltas, the raw deltas."""
    stream = ToolCallStream(plan)
    deltas = [delta for piece in pieces for delta in stream.feed(piece)] + stream.finish()
    content = "".join(d.content or "" for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    raw = [d.model_dump() for d in deltas]
    for delta in deltas:
        for part in delta.tool_calls or ():
            slot = calls.setdefault(
                part.index, {"id": part.id, "name": part.function.name, "arguments": ""}
            )
            slot["arguments"] += part.function.arguments or ""
    return content, [calls[i] for i in sorted(calls)], raw


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_calls_match_the_whole_reply_parse(size: int) -> None:
    text = (
        "Checking <tool_c now.\n"
        + PARIS_CALL
        + "\n"
        + _call("nope", "{}")
        + _call("get_time", "{}")
    )
    plan = plan_of(tools=[WEATHER, TIME])
    content, calls, raw = _stream(plan, _pieces(text, size))
    message, _ = choice_message(plan, text, "stop")
    assert content == message.content
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]
    # A call's first delta carries index, id, type and name; later ones only arguments.
    first = next(d for d in raw if d.get("tool_calls"))["tool_calls"][0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"


def test_streamed_text_is_held_only_while_it_could_open_a_call() -> None:
    stream = ToolCallStream(plan_of(tools=[TIME]))
    assert [d.content for d in stream.feed("Hello <tool")] == ["Hello"]
    assert [d.content for d in stream.feed("box> fine")] == [" <toolbox> fine"]


def test_named_calls_stream_arguments_as_generated() -> None:
    plan = plan_of(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    content, calls, raw = _stream(plan, ['{"ci', 'ty": "Ro', 'me"}'])
    assert content == "" and calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == '{"city": "Rome"}'
    assert len(raw) == 4  # the header, then one arguments fragment per piece


def test_required_streams_the_array_once_whole_and_none_streams_text() -> None:
    plan = plan_of(tools=[WEATHER, TIME], tool_choice="required")
    _, calls, _ = _stream(plan, ['[{"name": "get_time", ', '"arguments": {}}]'])
    assert [c["name"] for c in calls] == ["get_time"]
    content, calls, _ = _stream(plan_of(tools=[TIME], tool_choice="none"), ["<tool_call>", "x"])
    assert (content, calls) == ("<tool_call>x", [])
