"""Structured output through the official openai SDK against a real uvicorn Titan serving the real
embedded model: response_format json_schema / json_object, the SDK's pydantic ``parse``, vLLM's
guided_* extras on chat and completions, streaming, 400s naming the field, and the degradation
step that relaxes the constraint under overload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.integration.harness import running_titan
from titan.config import config_from_mapping
from titan.service.pipeline import Pipeline

pytestmark = pytest.mark.slow

ENGINE = {"backend": "embedded", "engine": {"max_model_len": 1024}}
# The ladder is configured but idle (level 0) until the degradation test forces its one step.
DEGRADATION = {"queue_wait_p95_s": 1.0, "sustain_s": 60,
               "steps": [{"action": "relax_structured_output"}]}  # fmt: skip
CONFIG = {
    "models": [{"name": "smol", "deployments": [ENGINE], "degradation": DEGRADATION}],
    "probes": {"enabled": False},
    "cache": {"exact": False},
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
        "landmarks": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "maxItems": 2,
        },
    },
    "required": ["city", "country", "population_millions", "landmarks"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Paris as JSON."}]


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    size: Literal["small", "medium", "large"]


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline(config_from_mapping(CONFIG, "test"))


@pytest.fixture(scope="module")
def client(pipeline: Pipeline) -> Iterator[openai.OpenAI]:
    with (
        running_titan(pipeline.config, pipeline=pipeline) as base_url,
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as sdk,
    ):
        yield sdk


def schema_format(schema: dict) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": schema, "strict": True},
    }


def test_json_schema_response_format_validates(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="smol", messages=ASK, response_format=schema_format(CITY_SCHEMA),
        temperature=0.8, seed=1, n=2, max_tokens=80,
    )  # fmt: skip
    for choice in completion.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), CITY_SCHEMA)


def test_streamed_json_schema_assembles_into_the_same_object(client: openai.OpenAI) -> None:
    kwargs = {"model": "smol", "messages": ASK, "temperature": 0, "max_tokens": 80,
              "response_format": schema_format(CITY_SCHEMA)}  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), CITY_SCHEMA)


def test_json_object_mode(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Give a JSON object with a name."}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=32,
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.message.content.startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Describe Lyon."}],
        response_format=City, temperature=0, max_tokens=48,
    )  # fmt: skip
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)
    assert parsed.size in ("small", "medium", "large")


def test_guided_extras_on_chat_and_completions(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Is the sky blue?"}],
        extra_body={"guided_choice": ["yes", "no"]}, temperature=0, max_tokens=8,
    )  # fmt: skip
    assert chat.choices[0].message.content in ("yes", "no")
    completion = client.completions.create(
        model="smol", prompt="The date today is", max_tokens=16, temperature=0,
        extra_body={"guided_regex": r"\d{4}-\d{2}-\d{2}"},
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "stop"
    text = completion.choices[0].text
    assert len(text) == 10 and text[4] == "-" and text.replace("-", "").isdigit()
    guided = client.completions.create(
        model="smol", prompt="A city:", max_tokens=48, temperature=0,
        extra_body={"guided_json": CITY_SCHEMA},
    )  # fmt: skip
    jsonschema.validate(json.loads(guided.choices[0].text), CITY_SCHEMA)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": schema_format({"type": "objectx"})}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_regex": "a(b"}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_grammar": "start: nowhere"}, "guided_grammar"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json"),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(
    client: openai.OpenAI, extra: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="smol", messages=ASK, max_tokens=4, extra_body=extra)
    assert refused.value.body["param"] == param, refused.value.body


def test_overload_degradation_relaxes_the_constraint(
    client: openai.OpenAI, pipeline: Pipeline
) -> None:
    """With the relax_structured_output step applied, the request runs unconstrained (the same
    greedy text as a plain request) and says so in x-titan-degraded."""
    kwargs = {"model": "smol", "messages": [{"role": "user", "content": "Hi!"}],
              "temperature": 0, "max_tokens": 8}  # fmt: skip
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    constrained = client.chat.completions.with_raw_response.create(
        extra_body={"guided_choice": ["yes", "no"]}, **kwargs
    )
    assert "x-titan-degraded" not in constrained.headers
    assert constrained.parse().choices[0].message.content in ("yes", "no")
    controller = pipeline.services.flow.gates.degradation.controllers["smol"]
    controller.level = 1
    try:
        relaxed = client.chat.completions.with_raw_response.create(
            extra_body={"guided_choice": ["yes", "no"]}, **kwargs
        )
    finally:
        controller.level = 0
    assert relaxed.headers["x-titan-degraded"] == "relax_structured_output"
    assert relaxed.parse().choices[0].message.content == plain
