"""Function tools on /v1/responses through the official openai SDK, against a real Titan serving
the embedded model (SmolLM2-135M-Instruct): forced calls come back as function_call items (and
no empty message), their results go back as function_call_output items with or without
``previous_response_id`` (the loop openai-agents' Responses model runs), the SDK's stream helper
validates the function call events and parses the arguments, and an output cut by
``max_output_tokens`` is ``incomplete``. ``include`` logprobs and ``text.format`` reach the
model."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "strict": True,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
    },
    "strict": False,
}
TOOLS = [ADD, WEATHER]
PARAMETERS = {tool["name"]: tool["parameters"] for tool in TOOLS}
ASK = "What is 2 plus 3?"
# Room for a forced call to close (one is ~15-25 tokens here).
MAX_TOKENS = 48
CONFIG = {
    "models": [{"deployments": [{"backend": "embedded", "engine": {"max_model_len": 1024}}]}],
    "probes": {"enabled": False},
    "cache": {"exact": False},  # every request reaches the model
}


def calls_of(response: Any) -> list[Any]:
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.id.startswith("fc_") and call.call_id and call.status == "completed"
        jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])
    return calls


@pytest.fixture(scope="module")
def first(client: openai.OpenAI, model: str) -> Any:
    """A call forced by 'required', made once for the tests that continue it."""
    return client.responses.create(
        model=model,
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_output_tokens=MAX_TOKENS,
    )


def test_a_forced_call_is_a_function_call_item_and_no_empty_message(first: Any):
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["function_call"] * len(first.output)
    assert len(calls_of(first)) >= 1
    assert first.tools[0].name == "add" and first.tool_choice == "required"


def test_the_result_goes_back_with_previous_response_id(
    client: openai.OpenAI, model: str, first: Any
):
    call = calls_of(first)[0]
    answer = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        tools=TOOLS,
        temperature=0,
        max_output_tokens=16,
    )
    assert answer.output[-1].type in ("message", "function_call")
    items = client.responses.input_items.list(answer.id, order="asc").data
    assert [i.type for i in items[:2]] == ["message", "function_call"]
    assert items[1].id == call.id and items[1].call_id == call.call_id
    assert items[-1].type == "function_call_output" and items[-1].output == "5"


def test_the_whole_loop_replayed_without_previous_response_id(
    client: openai.OpenAI, model: str, first: Any
):
    """What openai-agents sends each turn when it keeps the history itself: the question,
    the output items as they came, and the results."""
    replay = [{"role": "user", "content": ASK}]
    replay += [item.model_dump(exclude_none=True) for item in first.output]
    replay += [
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
        for call in calls_of(first)
    ]
    answer = client.responses.create(
        model=model,
        input=replay,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_output_tokens=16,
    )
    assert [item.type for item in answer.output] == ["message"]
    listed = client.responses.input_items.list(answer.id, order="asc", limit=100).data
    assert [i.type for i in listed] == [item.get("type", "message") for item in replay]


def test_named_and_single_calls(client: openai.OpenAI, model: str):
    named = client.responses.create(
        model=model,
        input="Weather in Paris?",
        tools=TOOLS,
        temperature=0,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=MAX_TOKENS,
    )
    assert [call.name for call in calls_of(named)] == ["get_weather"]
    single = client.responses.create(
        model=model,
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0.8,
        max_output_tokens=MAX_TOKENS,
    )
    assert len(calls_of(single)) == 1 and single.parallel_tool_calls is False


def test_the_sdk_stream_helper_validates_function_call_events(client: openai.OpenAI, model: str):
    with client.responses.stream(
        model=model,
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "add"},
        temperature=0,
        max_output_tokens=MAX_TOKENS,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "response.content_part.added" not in kinds  # no message: the call only
    (call,) = calls_of(final)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert call.arguments == deltas and call.parsed_arguments == json.loads(deltas)  # strict
    assert [e.sequence_number for e in events] == list(range(len(events)))
    stored = client.responses.retrieve(final.id)
    assert stored.output[0].call_id == call.call_id


def test_an_output_cut_by_max_output_tokens_is_incomplete(client: openai.OpenAI, model: str):
    cut = client.responses.create(model=model, input="Tell me a story.", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    events = list(
        client.responses.create(
            model=model, input="Tell me a story.", max_output_tokens=2, stream=True
        )
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].status == "incomplete"


def test_logprobs_and_text_format_reach_the_model(client: openai.OpenAI, model: str):
    response = client.responses.create(
        model=model,
        input="Say hi.",
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        max_output_tokens=4,
        temperature=0,
    )
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    shaped = client.responses.create(
        model=model,
        input=ASK,
        max_output_tokens=24,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "sum", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(shaped.output_text), schema)


def test_a_bad_tool_schema_is_a_400_naming_the_responses_field(titan: str, model: str):
    bad = {**ADD, "parameters": {"type": "nonsense"}}
    answer = httpx.post(
        f"{titan}/v1/responses",
        json={"model": model, "input": ASK, "tools": [WEATHER, bad], "tool_choice": "required"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "tools[1].parameters"


def test_truncation_disabled_refuses_what_auto_trims(client: openai.OpenAI, model: str):
    long_turn = "Remember this list: " + ", ".join(f"item {n}" for n in range(150))
    first = client.responses.create(model=model, input=long_turn, max_output_tokens=1)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=model, input=long_turn, previous_response_id=first.id, max_output_tokens=1,
            truncation="disabled",
        )  # fmt: skip
    assert raised.value.body["param"] == "input"
    trimmed = client.responses.with_raw_response.create(
        model=model, input=long_turn, previous_response_id=first.id, max_output_tokens=1
    )
    assert trimmed.http_response.json()["context"]["dropped_turns"] == 1
    assert trimmed.parse().truncation == "auto"
