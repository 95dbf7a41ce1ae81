"""closing_suffix: every prefix of a JSON document in the grammar's layout closes into JSON."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from titan.engine.json_closing import closing_suffix

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
    allow_infinity=False) | st.text(max_size=8)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def layout(value: object, ensure_ascii: bool) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=ensure_ascii)


@settings(max_examples=300, deadline=None)
@given(value=VALUES, ensure_ascii=st.booleans())
def test_every_prefix_closes_into_json(value: object, ensure_ascii: bool) -> None:
    document = layout(value, ensure_ascii)
    for end in range(1, len(document) + 1):
        prefix = document[:end]
        suffix = closing_suffix(prefix)
        assert suffix is not None, prefix
        json.loads(prefix + suffix)
    assert closing_suffix(document) == ""


def test_examples() -> None:
    assert closing_suffix('{"name": "Par') == '"}'
    assert closing_suffix('{"a": [1, {"b": tr') == "ue}]}"
    assert closing_suffix('{"a": 1, ') == '"": null}'
    assert closing_suffix('{"a') == '": null}'
    assert closing_suffix('{"a": "x\\') == '\\"}'
    assert closing_suffix('{"a": "\\u00') == '00"}'
    assert closing_suffix("[1.") == "0]"


def test_text_outside_the_layout_is_none() -> None:
    for prefix in ('{"a":1', "{ ", '{"a": 1,"b"', "}", '["a"}'):
        assert closing_suffix(prefix) is None, prefix
