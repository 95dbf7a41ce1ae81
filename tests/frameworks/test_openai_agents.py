"""openai-agents, unchanged, on both of its OpenAI models (chat completions and Responses)
against a real Titan: a forced function tool is called, run by the SDK and its result fed back
until the agent answers within ``max_turns``; streamed runs deliver the same items; a second
turn carries the first one's history (as items, and on Responses by ``previous_response_id``);
an ``output_type`` parses into its pydantic model.

The model is the 135M one: what is checked is the contract (calls arrive as calls, outputs
parse, the loop ends), never the quality of an answer.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import (
    Agent,
    MessageOutputItem,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import Model
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL_KINDS = ("chat_completions", "responses")
# A forced call here is ~20 tokens; the answer after it is cut short, which is fine.
MAX_TOKENS = 48
MAX_TURNS = 4
# `required` for the first turn: the 135M model rarely calls on its own. The SDK resets it to
# auto once a tool ran (reset_tool_choice), so the next turn can answer and end the loop.
FORCED = ModelSettings(tool_choice="required", temperature=0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module", autouse=True)
def _no_tracing() -> None:
    # The SDK exports traces to api.openai.com unless told not to.
    set_tracing_disabled(True)


def model_of(kind: str, client: AsyncOpenAI, name: str) -> Model:
    if kind == "chat_completions":
        return OpenAIChatCompletionsModel(model=name, openai_client=client)
    return OpenAIResponsesModel(model=name, openai_client=client)


class Ledger:
    """A tool with a memory: every call the agent made, with its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers and return their sum."""
            self.calls.append((a, b))
            return a + b

        self.tool = add


def calculator(kind: str, client: AsyncOpenAI, model: str, ledger: Ledger) -> Agent[Any]:
    return Agent(
        name="calculator",
        instructions="You add numbers with the add tool.",
        tools=[ledger.tool],
        model=model_of(kind, client, model),
        model_settings=FORCED,
    )


def assert_tool_loop(items: list[Any], ran: list[tuple[int, int]]) -> None:
    """Each call the model made was run by the SDK (``ran``: the tool's calls in that run),
    its output paired with the call, and the run ended on a message from the model."""
    calls = [item for item in items if isinstance(item, ToolCallItem)]
    outputs = [item for item in items if isinstance(item, ToolCallOutputItem)]
    assert calls, items
    assert len(outputs) == len(calls) == len(ran)
    for call, output, (a, b) in zip(calls, outputs, ran, strict=True):
        assert call.raw_item.name == "add"
        assert output.raw_item["call_id"] == call.raw_item.call_id
        assert output.output == a + b
    assert isinstance(items[-1], MessageOutputItem)


@pytest.mark.parametrize("kind", MODEL_KINDS)
async def test_a_tool_call_is_run_and_a_second_turn_keeps_the_history(
    base_url: str, model: str, kind: str
) -> None:
    ledger = Ledger()
    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        agent = calculator(kind, client, model, ledger)
        first = await Runner.run(agent, "What is 2 plus 3?", max_turns=MAX_TURNS)
        assert_tool_loop(first.new_items, ledger.calls)
        assert isinstance(first.final_output, str)
        # A call turn, then at least the answer.
        assert len(first.raw_responses) >= 2

        # The second turn sends the whole first run back as input items: the user message,
        # the function call, its output and the answer.
        history = first.to_input_list()
        assert {"function_call", "function_call_output"} <= {item.get("type") for item in history}
        num_first_calls = len(ledger.calls)
        second = await Runner.run(
            agent,
            [*history, {"role": "user", "content": "Now add 10 and 4."}],
            max_turns=MAX_TURNS,
        )
    assert_tool_loop(second.new_items, ledger.calls[num_first_calls:])
    # The history reached the model: the second run's first prompt is the longer one.
    opening = first.raw_responses[0].usage.input_tokens
    assert second.raw_responses[0].usage.input_tokens > opening + 20


@pytest.mark.parametrize("kind", MODEL_KINDS)
async def test_a_streamed_run_delivers_the_call_its_output_and_the_answer(
    base_url: str, model: str, kind: str
) -> None:
    ledger = Ledger()
    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        agent = calculator(kind, client, model, ledger)
        result = Runner.run_streamed(agent, "Add 7 and 8.", max_turns=MAX_TURNS)
        events = [event async for event in result.stream_events()]
    names = [event.name for event in events if event.type == "run_item_stream_event"]
    assert result.is_complete and isinstance(result.final_output, str)
    assert names[:2] == ["tool_called", "tool_output"]
    assert names[-1] == "message_output_created"
    assert_tool_loop(result.new_items, ledger.calls)


async def test_responses_continue_from_previous_response_id(base_url: str, model: str) -> None:
    """The SDK sends only the new turn; Titan restores the rest from the stored response."""
    ledger = Ledger()
    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        agent = calculator("responses", client, model, ledger)
        first = await Runner.run(agent, "What is 2 plus 3?", max_turns=MAX_TURNS)
        assert_tool_loop(first.new_items, ledger.calls)
        assert first.last_response_id
        num_first_calls = len(ledger.calls)
        second = await Runner.run(
            agent,
            "Now add 10 and 4.",
            previous_response_id=first.last_response_id,
            max_turns=MAX_TURNS,
        )
    assert_tool_loop(second.new_items, ledger.calls[num_first_calls:])
    # Titan read the stored conversation: the continued prompt is longer than the first one.
    opening = first.raw_responses[0].usage.input_tokens
    assert second.raw_responses[0].usage.input_tokens > opening + 20


class Verdict(BaseModel):
    topic: str = Field(max_length=40)
    is_question: bool
    confidence: int = Field(ge=0, le=100)


@pytest.mark.parametrize("kind", MODEL_KINDS)
async def test_an_output_type_parses_into_its_model(base_url: str, model: str, kind: str) -> None:
    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0) as client:
        agent = Agent(
            name="classifier",
            instructions="Classify the user's message.",
            model=model_of(kind, client, model),
            model_settings=ModelSettings(temperature=0, max_tokens=64),
            output_type=Verdict,
        )
        result = await Runner.run(agent, "Is it going to rain in Lisbon?", max_turns=1)
    assert isinstance(result.final_output, Verdict)
