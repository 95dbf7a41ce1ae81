"""LangChain, unchanged, against a real Titan: ``with_structured_output`` in each method
langchain-openai offers (json_schema and function_calling, strict or not, and json_mode), and
an agent from ``langchain.agents.create_agent`` whose tool the framework runs before the model
answers.

The model is the 135M one: the contract is checked (outputs parse, calls are calls, the graph
ends), never the quality of an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

PROMPT = "Describe the city of Lyon: its name, its country and its population in millions."


class City(BaseModel):
    """A city, the country it is in, and how many people live there."""

    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: int = Field(ge=0, le=40)


def chat_model(base_url: str, model: str, max_tokens: int) -> ChatOpenAI:
    # use_responses_api=False: chat completions whatever langchain-openai's heuristics pick.
    return ChatOpenAI(
        base_url=base_url,
        api_key="none",
        model=model,
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        use_responses_api=False,
    )


@pytest.mark.parametrize(
    ("method", "strict", "finish_reason"),
    [
        ("json_schema", None, "stop"),
        ("json_schema", True, "stop"),
        ("function_calling", None, "tool_calls"),
        ("function_calling", True, "tool_calls"),
    ],
)
def test_structured_output_parses_into_the_model(
    base_url: str, model: str, method: str, strict: bool | None, finish_reason: str
) -> None:
    structured = chat_model(base_url, model, 80).with_structured_output(
        City, method=method, strict=strict, include_raw=True
    )
    out = structured.invoke(PROMPT)
    assert out["parsing_error"] is None, out["raw"]
    assert isinstance(out["parsed"], City)
    raw = out["raw"]
    assert raw.response_metadata["finish_reason"] == finish_reason
    if method == "function_calling":
        # A call forced to the schema's tool, its arguments the parsed object.
        (call,) = raw.tool_calls
        assert call["name"] == "City" and City.model_validate(call["args"]) == out["parsed"]
    else:
        assert not raw.tool_calls and City.model_validate_json(raw.content) == out["parsed"]


def test_json_mode_returns_a_json_object(base_url: str, model: str) -> None:
    """json_mode promises a JSON object, not the schema: a JSON Schema dict (not a pydantic
    class) makes LangChain hand back that object as parsed."""
    schema = {"title": "city", "description": "A city.", **City.model_json_schema()}
    structured = chat_model(base_url, model, 80).with_structured_output(
        schema, method="json_mode", include_raw=True
    )
    out = structured.invoke(f"{PROMPT} Reply in JSON.")
    assert out["parsing_error"] is None, out["raw"]
    assert isinstance(out["parsed"], dict) and out["parsed"]
    assert out["raw"].response_metadata["finish_reason"] == "stop"


def test_an_agent_runs_its_tool_and_answers(base_url: str, model: str) -> None:
    looked_up: list[str] = []

    @tool
    def lookup_capital(country: str) -> str:
        """The capital city of a country."""
        looked_up.append(country)
        return "Rome"

    # The 135M model rarely calls on its own: the first model call must call a tool, the one
    # after the tool's result must answer. Middleware is LangChain's place for such a policy.
    @wrap_model_call
    def call_then_answer(
        request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        has_result = any(isinstance(message, ToolMessage) for message in request.messages)
        return handler(request.override(tool_choice="none" if has_result else "required"))

    agent = create_agent(
        chat_model(base_url, model, 48),
        [lookup_capital],
        system_prompt="You answer questions about countries with your tools.",
        middleware=[call_then_answer],
    )
    state: dict[str, Any] = agent.invoke(
        {"messages": [HumanMessage("What is the capital of Italy?")]},
        {"recursion_limit": 8},
    )
    messages = state["messages"]
    kinds = [type(message) for message in messages]
    assert kinds == [HumanMessage, AIMessage, ToolMessage, AIMessage], messages
    call_turn, result, answer = messages[1:]
    (call,) = call_turn.tool_calls
    assert call["name"] == "lookup_capital" and looked_up == [call["args"]["country"]]
    assert call_turn.response_metadata["finish_reason"] == "tool_calls"
    assert result.tool_call_id == call["id"] and result.content == "Rome"
    assert not answer.tool_calls and answer.content
