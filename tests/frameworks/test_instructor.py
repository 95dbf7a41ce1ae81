"""instructor, unchanged, on the openai SDK against a real Titan, in the modes that reach
Titan's structured output and tool calls: JSON_SCHEMA (``response_format`` json_schema), TOOLS
(a call forced to the model's tool) and PARALLEL_TOOLS (several calls in one reply).

The model is the 135M one: the contract is checked (replies parse into the pydantic models),
never the quality of an answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import instructor
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow


class Booking(BaseModel):
    """A table booked at a restaurant."""

    restaurant: str = Field(max_length=30)
    guests: int = Field(ge=1, le=12)
    day: str = Field(max_length=12)


class Weather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=30)


class LocalTime(BaseModel):
    """The local time in an IANA timezone."""

    timezone: str = Field(max_length=40)


@pytest.fixture(scope="module")
def sdk(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        yield client


@pytest.mark.parametrize(
    ("mode", "finish_reason"),
    [(instructor.Mode.JSON_SCHEMA, "stop"), (instructor.Mode.TOOLS, "tool_calls")],
)
def test_a_reply_parses_into_the_response_model(
    sdk: openai.OpenAI, model: str, mode: instructor.Mode, finish_reason: str
) -> None:
    client = instructor.from_openai(sdk, mode=mode)
    booking, completion = client.chat.completions.create_with_completion(
        model=model,
        response_model=Booking,
        messages=[{"role": "user", "content": "Book Chez Marie for four on Friday."}],
        max_tokens=64,
        temperature=0,
        max_retries=0,  # a reply that does not parse fails the test, not a second attempt
    )
    assert isinstance(booking, Booking)
    assert completion.choices[0].finish_reason == finish_reason


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_parallel_tools_parse_every_call(sdk: openai.OpenAI, model: str) -> None:
    """PARALLEL_TOOLS always sends tool_choice="auto" (instructor overrides any other), so the
    model has to choose to call: one earlier exchange where the assistant made two calls shows
    the 135M model how. What is checked is Titan reading the calls out of the model's own text
    as parallel tool_calls, and instructor parsing each into its class."""
    client = instructor.from_openai(sdk, mode=instructor.Mode.PARALLEL_TOOLS)
    messages = [
        {"role": "user", "content": "What is the weather in Oslo and the time in Lima?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("call_1", "Weather", {"city": "Oslo"}),
                _call("call_2", "LocalTime", {"timezone": "America/Lima"}),
            ],
        },
        {"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"},
    ]
    # create_with_completion fails on this mode in instructor (it reads _raw_response off the
    # iterator it returns); its hook hands over the completion instead.
    completions: list[Any] = []
    client.on("completion:response", completions.append)
    results = client.chat.completions.create(
        model=model,
        response_model=Iterable[Weather | LocalTime],
        messages=messages,
        max_tokens=96,
        temperature=0,
        max_retries=0,
    )
    parsed = list(results)
    (completion,) = completions
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(parsed) == len(choice.message.tool_calls) >= 2
    assert {type(item) for item in parsed} == {Weather, LocalTime}
