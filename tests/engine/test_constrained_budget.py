"""Constrained output always ends within max_tokens: for every kind of constraint, at budgets
from the stated minimum (the 400's number) upward, greedy and sampled, the output satisfies its
constraint and finishes with "stop"."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.engine.conftest import chat
from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.outputs import FinishReason
from titan.engine.sampling_params import SamplingParams, StructuredOutput
from titan.errors import InvalidRequestError

pytestmark = pytest.mark.slow

# Unbounded arrays of objects and optional nested objects: a sampled token can open a value
# whose shortest end is many tokens away.
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "email": {"type": "string", "format": "email"},
        "placed": {"type": "string", "format": "date"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "quantity"],
            },
        },
        "shipping": {
            "type": "object",
            "properties": {
                "method": {"enum": ["ground", "air", "pickup"]},
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"],
                },
            },
            "required": ["method"],
        },
        "notes": {"type": ["string", "null"]},
    },
    "required": ["customer", "email", "placed", "items"],
}
CASES = {
    "order": (StructuredOutput("json_schema", json.dumps(ORDER_SCHEMA)), "List an order."),
    "object": (StructuredOutput("json_object"), "Describe a city as a JSON object."),
    "regex": (
        StructuredOutput("regex", r"[a-z]+(, [a-z]+)*\.", param="guided_regex"),
        "Name some fruits.",
    ),
    "choice": (
        StructuredOutput("choice", choices=("positive", "negative", "neutral"), param="x"),
        "Is 'I loved it' positive?",
    ),
    "grammar": (
        StructuredOutput(
            "grammar",
            'start: "(" expr ")"\nexpr: NUMBER | "(" expr ")" | expr "+" expr\nNUMBER: /[0-9]+/',
            param="guided_grammar",
        ),
        "Write a sum.",
    ),
}


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = Engine(EngineConfig(dtype="float32", num_threads=1))
    yield engine
    engine.close()


def minimum(engine: Engine, prompt: list[int], structured: StructuredOutput) -> int:
    """The budget the engine states as the least that fits (from its 400 at max_tokens=1)."""
    try:
        engine.validate_prompt(prompt, SamplingParams(max_tokens=1, structured=structured))
    except InvalidRequestError as error:
        assert error.param == "max_tokens"
        return int(re.search(r"takes (\d+) tokens", str(error)).group(1))
    return 1


def satisfies(name: str, text: str) -> bool:
    if name == "order":
        jsonschema.validate(
            json.loads(text), ORDER_SCHEMA, format_checker=jsonschema.FormatChecker()
        )
        return True
    if name == "object":
        return isinstance(json.loads(text), dict)
    if name == "regex":
        return re.fullmatch(r"[a-z]+(, [a-z]+)*\.", text) is not None
    if name == "choice":
        return text in ("positive", "negative", "neutral")
    return re.fullmatch(r"\(.*\)", text) is not None and text.count("(") == text.count(")")


def test_every_kind_ends_whole_at_every_budget_from_its_minimum(engine: Engine):
    expected = {}
    for name, (structured, question) in CASES.items():
        prompt = chat(engine, question)
        least = minimum(engine, prompt, structured)
        for extra in (0, 1, 2, 3, 5, 8, 13, 21, 40):
            for temperature in (0.0, 0.8, 1.3):
                rid = f"{name}-{least + extra}-{temperature}"
                params = SamplingParams(
                    max_tokens=least + extra,
                    temperature=temperature,
                    seed=extra,
                    structured=structured,
                )
                engine.add_request(rid, prompt, params)
                expected[rid] = name
    texts = {rid: [] for rid in expected}
    reasons = {}
    while engine.has_unfinished:
        for output in engine.step():
            texts[output.request_id].append(output.text)
            if output.is_finished:
                reasons[output.request_id] = output.finish_reason
    failures = []
    for rid, name in expected.items():
        text = "".join(texts[rid])
        try:
            ok = satisfies(name, text)
        except (ValueError, jsonschema.ValidationError):
            ok = False
        if not ok or reasons[rid] != FinishReason.STOP:
            failures.append((rid, reasons[rid], text))
    assert not failures, failures
