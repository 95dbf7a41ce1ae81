"""GrammarCloser: from any point of a constrained output, a text that ends it inside the grammar
(a JSON document, a schema's object, a regex, a choice), short enough to steer into before
max_tokens runs out; and the engine's refusal of a max_tokens that no output fits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titan.engine.constraints import GrammarCache
from titan.engine.grammar_closing import GrammarCloser
from titan.engine.sampling_params import StructuredOutput
from titan.engine.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]}, "minItems": 2},
        "note": {"type": "string"},
    },
    "required": ["city", "population", "tags"],
    "additionalProperties": False,
}
# Text the model writes (the grammar's JSON strings take no control or unassigned characters).
TEXT = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=("Cs", "Cc", "Cn")),
    max_size=6,
)
SCALARS = st.none() | st.booleans() | st.integers() | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def grammars(hf_dir: Path, tokenizer: Tokenizer) -> GrammarCache:
    return GrammarCache(hf_dir / "tokenizer.json", tokenizer.vocab_size, (2,))


@pytest.fixture(scope="module")
def closer(tokenizer: Tokenizer) -> GrammarCloser:
    return GrammarCloser(tokenizer.token_bytes, tokenizer.vocab_size, tokenizer.encode)


def closed_text(grammars, closer, tokenizer, structured: StructuredOutput, prefix: str) -> str:
    """``prefix`` fed to a fresh matcher, then the closer's completion: the whole output."""
    state = grammars.new_state(structured)
    token_ids = tokenizer.encode(prefix)
    if token_ids:
        assert state.matcher.consume_tokens(token_ids), (prefix, state.matcher.get_error())
    completion = closer.completion(state.matcher, limit=256)
    assert completion is not None, prefix
    assert state.matcher.consume_tokens(completion) and state.matcher.is_accepting(), prefix
    return tokenizer.decode(token_ids + completion)


@settings(max_examples=60, deadline=None)
@given(value=st.dictionaries(TEXT, VALUES, max_size=4))
def test_every_prefix_of_a_json_object_closes_into_json(grammars, closer, tokenizer, value):
    document = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    object_mode = StructuredOutput(kind="json_object")
    for end in range(1, len(document) + 1, 3):
        text = closed_text(grammars, closer, tokenizer, object_mode, document[:end])
        json.loads(text)  # parses, whatever was cut


def test_every_prefix_of_a_schema_document_closes_into_a_valid_one(grammars, closer, tokenizer):
    structured = StructuredOutput(kind="json_schema", spec=json.dumps(SCHEMA))
    document = '{"city": "Paris", "population": 2100000, "tags": ["big", "old"], "note": "ok"}'
    for end in range(0, len(document)):
        text = closed_text(grammars, closer, tokenizer, structured, document[:end])
        jsonschema.validate(json.loads(text), SCHEMA)  # required fields, enums, minItems


def test_regexes_and_choices_close_into_full_matches(grammars, closer, tokenizer):
    date = StructuredOutput(kind="regex", spec=r"\d{4}-\d{2}-\d{2}")
    for prefix in ("", "2", "2026-1", "2026-11-3"):
        assert re.fullmatch(
            r"\d{4}-\d{2}-\d{2}", closed_text(grammars, closer, tokenizer, date, prefix)
        )
    choice = StructuredOutput(kind="choice", choices=("alpha", "beta"))
    assert closed_text(grammars, closer, tokenizer, choice, "be") == "beta"
    assert closed_text(grammars, closer, tokenizer, choice, "") in ("alpha", "beta")


def test_the_completion_is_short(grammars, closer, tokenizer):
    structured = StructuredOutput(kind="json_schema", spec=json.dumps(SCHEMA))
    state = grammars.new_state(structured)
    state.matcher.consume_tokens(tokenizer.encode('{"city": "Par'))
    completion = closer.completion(state.matcher, limit=256)
    # '", "population": 0, "tags": ["big", "big"]}' and no more
    assert completion is not None and len(completion) <= 20


@pytest.mark.parametrize(
    "pattern",
    [
        r"(\S+\s){4}\S+",  # a cron line: each field loops until a space is taken
        r"(\w+ ){3}\w+",
        r"(ab)+c",
        r"x(yz)*(q|r)",
        r"[a-z]+@[a-z]+\.(com|org)",
        r"([A-Z][a-z]+ )+[A-Z]{2}",
        r"[a-z]+(, [a-z]+)*;",
    ],
)
def test_loops_in_a_regex_are_left_for_an_end(grammars, closer, tokenizer, pattern):
    """The greedy walk's first choice loops forever in these; it finds a way out instead, as
    the whole output (a regex) and as a JSON string's anchored pattern."""
    structured = StructuredOutput(kind="regex", spec=pattern)
    assert re.fullmatch(pattern, closed_text(grammars, closer, tokenizer, structured, ""))
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": f"^{pattern}$"}},
              "required": ["v"]}  # fmt: skip
    in_json = StructuredOutput(kind="json_schema", spec=json.dumps(schema))
    document = json.loads(closed_text(grammars, closer, tokenizer, in_json, ""))
    assert re.fullmatch(pattern, document["v"])
