"""Tool calls through the official openai SDK against a real uvicorn Titan serving the real
embedded model (SmolLM2-135M-Instruct): forced calls (``required``, a named function) always
yield calls whose arguments validate against the tool's parameters, streamed deltas assemble
into the same call, a conversation with a tool result answers, ``none`` never calls, bad tools
are 400s naming the parameter, and a job runs the same conversion.

The 135M model rarely chooses to call on its own, so ``auto``'s parsing is tested on crafted
text in tests/backends/test_embedded_tools.py; here only its live path runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# Short, yet room for a call to close (a forced call is ~15-25 tokens here).
MAX_TOKENS = 48
CONFIG = {
    "models": [{"deployments": [{"backend": "embedded", "engine": {"max_model_len": 1024}}]}],
    "probes": {"enabled": False},
    "cache": {"exact": False},  # every request reaches the model, streamed or not
    "jobs": {"poll_s": 0.05},
}


@pytest.fixture(scope="module")
def named(client: openai.OpenAI, model: str) -> Any:
    """A greedy call forced to get_weather, made once for the tests that compare with it."""
    return client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=NAMED, temperature=0,
        max_tokens=MAX_TOKENS,
    )  # fmt: skip


def assert_valid_call(name: str, arguments: str, allowed: set[str]) -> dict[str, Any]:
    assert name in allowed
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, PARAMETERS[name])
    return parsed


def test_named_and_required_always_yield_valid_calls(
    client: openai.OpenAI, model: str, named: Any
) -> None:
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert_valid_call(call.function.name, call.function.arguments, {"get_weather"})

    # n=2 with sampling: each choice is constrained and parsed on its own.
    required = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", n=2, seed=7,
        temperature=1.0, max_tokens=MAX_TOKENS, parallel_tool_calls=False,
    )  # fmt: skip
    assert len(required.choices) == 2
    for choice in required.choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls  # parallel_tool_calls=False: exactly one
        assert_valid_call(call.function.name, call.function.arguments, set(PARAMETERS))


def _assembled(chunks: list[Any]) -> tuple[str, list[dict[str, str]], str | None]:
    """The content, the calls and the finish reason, rebuilt from the SDK's chunks."""
    content, calls, reason = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for part in delta.tool_calls or ():
                slot = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += part.id or ""
                slot["name"] += (part.function and part.function.name) or ""
                slot["arguments"] += (part.function and part.function.arguments) or ""
            reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_streamed_forced_calls_assemble_into_the_same_call(
    client: openai.OpenAI, model: str, named: Any
) -> None:
    body = {"model": model, "messages": ASK, "tools": TOOLS, "temperature": 0}
    for tool_choice in (NAMED, "required"):
        whole = named
        if tool_choice == "required":
            whole = client.chat.completions.create(
                **body, tool_choice=tool_choice, max_tokens=MAX_TOKENS
            )
        stream = client.chat.completions.create(
            **body, tool_choice=tool_choice, max_tokens=MAX_TOKENS, stream=True
        )
        content, calls, reason = _assembled(list(stream))
        assert reason == "tool_calls" and content == ""
        expected = whole.choices[0].message.tool_calls
        assert [(c["name"], c["arguments"]) for c in calls] == [
            (c.function.name, c.function.arguments) for c in expected
        ]
        assert all(c["id"].startswith("call_") for c in calls)
        assert_valid_call(calls[0]["name"], calls[0]["arguments"], set(PARAMETERS))

    # The SDK's own stream helper assembles the deltas too.
    helper = getattr(client.chat.completions, "stream", None)
    if helper is None:
        helper = client.beta.chat.completions.stream
    with helper(**body, tool_choice=NAMED, max_tokens=MAX_TOKENS) as events:
        final = events.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert_valid_call(call.function.name, call.function.arguments, {"get_weather"})


def test_parallel_required_calls_stop_at_the_first_repeat(
    client: openai.OpenAI, model: str
) -> None:
    # Greedy and forced to call its one tool, SmolLM2-135M writes the same call again and
    # again (without the cut: 8 copies, the array's cap, ~180 tokens); the reply ends at the
    # first repeat.
    add = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": add, "required": ["a", "b"]},
        },
    }
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=[tool],
        tool_choice="required", temperature=0, max_tokens=400,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # One call is ~20 tokens and its repeat as many: the tokens stop there.
    assert reply.usage.completion_tokens <= 60


def test_a_tool_result_in_the_history_renders_and_is_answered(
    client: openai.OpenAI, model: str, named: Any
) -> None:
    message = named.choices[0].message
    history = [
        *ASK,
        message.model_dump(exclude_none=True),  # the assistant turn with its tool_calls
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C, sunny"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", temperature=0,
        max_tokens=24,
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    # The call and its result reached the prompt: it is longer than the question alone.
    alone = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    assert answer.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_none_never_calls_and_auto_answers(client: openai.OpenAI, model: str) -> None:
    calling = "Call get_weather for Paris. <tool_call>"
    messages = [{"role": "user", "content": calling}]
    for tool_choice in ("none", "auto"):
        response = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice, n=2,
            seed=3, max_tokens=12,
        )  # fmt: skip
        assert len(response.choices) == 2
        for choice in response.choices:
            if tool_choice == "none":
                assert choice.message.tool_calls is None and choice.finish_reason != "tool_calls"
            for call in choice.message.tool_calls or ():  # auto: whatever it called is valid
                assert_valid_call(call.function.name, call.function.arguments, set(PARAMETERS))
    # auto, streamed: the same content and calls as the whole greedy reply.
    body = {"model": model, "messages": messages, "tools": TOOLS, "temperature": 0}
    whole = client.chat.completions.create(**body, max_tokens=12).choices[0]
    content, calls, reason = _assembled(list(client.chat.completions.create(
        **body, max_tokens=12, stream=True)))  # fmt: skip
    assert (content or None, reason) == (whole.message.content, whole.finish_reason)
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls or ()
    ]


@pytest.mark.parametrize(
    ("changes", "param"),
    [
        ({"tools": {"type": "function"}}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"parameters": {}}}]},
            "tools[0].function.name",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s_naming_the_param(
    client: openai.OpenAI, model: str, changes: dict[str, Any], param: str
) -> None:
    body = {"model": model, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **changes}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body)
    assert caught.value.param == param


def test_a_job_makes_the_same_forced_call(titan: str, model: str) -> None:
    body = {"model": model, "messages": ASK, "tools": TOOLS, "tool_choice": NAMED,
            "temperature": 0, "max_tokens": MAX_TOKENS}  # fmt: skip
    with httpx.Client(base_url=titan) as http:
        job = http.post("/v1/jobs", json={"endpoint": "/v1/chat/completions", "body": body})
        assert job.status_code == 202, job.text
        deadline = time.monotonic() + 60
        while (done := http.get(f"/v1/jobs/{job.json()['id']}").json())["status"] not in (
            "succeeded",
            "failed",
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert done["status"] == "succeeded", done
    (call,) = done["result"]["choices"][0]["message"]["tool_calls"]
    assert_valid_call(call["function"]["name"], call["function"]["arguments"], {"get_weather"})
