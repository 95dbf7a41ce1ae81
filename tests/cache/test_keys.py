"""What must and must not change a request's cache key and semantic scope."""

from __future__ import annotations

import pytest

from titan.cache.keys import is_deterministic, parse_directives, request_keys
from titan.errors import InvalidRequestError

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def body(question: str = "What is the capital of France?", **params) -> dict:
    return {"model": "m", "messages": [SYSTEM, {"role": "user", "content": question}], **params}


def exact(tenant: str | None = "acme", model: str = "m", data: dict | None = None) -> str:
    return request_keys(tenant, model, "chat", data if data is not None else body()).exact


@pytest.mark.parametrize(
    "same",
    [
        body("  What is the capital of France?\n"),  # surrounding whitespace
        body("What is the capital of France?", stream=True, stream_options={"include_usage": 1}),
        body(user="someone", metadata={"a": "b"}, cache="no-store"),
        body(temperature=1, top_p=1, n=1, presence_penalty=0, stop=None),  # the defaults
        {"messages": body()["messages"], "model": "m"},  # key order
        body("What is the capital of Fran\u0063e?"),
    ],
)
def test_what_does_not_change_the_key(same):
    assert exact(data=same) == exact()


@pytest.mark.parametrize(
    "different",
    [
        body("What is the capital of Spain?"),
        body(temperature=0),
        body(max_tokens=10),
        body(stop=["\n"]),
        body(seed=7),
        body(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        body(response_format={"type": "json_object"}),
        {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    ],
)
def test_what_changes_the_key(different):
    assert exact(data=different) != exact()


def test_tenant_and_model_are_part_of_the_key():
    assert exact(tenant="acme") != exact(tenant="other")
    assert exact(tenant=None) != exact(tenant="acme")
    assert exact(model="m") != exact(model="n")


def test_max_completion_tokens_is_max_tokens():
    assert exact(data=body(max_completion_tokens=5)) == exact(data=body(max_tokens=5))


def test_content_parts_are_their_text():
    parts = [{"type": "text", "text": "What is the capital of France?"}]
    assert exact(data=body(parts)) == exact()  # type: ignore[arg-type]


def test_the_scope_is_the_conversation_without_its_last_question():
    first = request_keys("acme", "m", "chat", body("What is the capital of France?"))
    second = request_keys("acme", "m", "chat", body("Which city is France's capital?"))
    assert first.scope == second.scope
    assert first.question == "What is the capital of France?"
    other_system = body()
    other_system["messages"][0] = {"role": "system", "content": "Answer in French."}
    assert request_keys("acme", "m", "chat", other_system).scope != first.scope
    follow_up = body()
    follow_up["messages"][1:1] = [
        {"role": "user", "content": "Tell me about Spain."},
        {"role": "assistant", "content": "Spain is in Europe."},
    ]
    assert request_keys("acme", "m", "chat", follow_up).scope != first.scope
    assert request_keys("other", "m", "chat", body()).scope != first.scope


def test_completions_have_an_exact_key_and_no_scope():
    keys = request_keys("acme", "m", "completion", {"model": "m", "prompt": "Once upon"})
    assert keys.scope is None
    again = request_keys("acme", "m", "completion", {"model": "m", "prompt": "Once upon "})
    assert keys.exact == again.exact


def test_only_greedy_or_seeded_requests_are_deterministic():
    assert is_deterministic({"temperature": 0})
    assert is_deterministic({"temperature": 0.7, "seed": 1})
    assert not is_deterministic({})
    assert not is_deterministic({"temperature": 0.2})


def test_directives_from_the_header_and_the_body():
    assert parse_directives("no-cache, No-Store", None) == {"no-cache", "no-store"}
    assert parse_directives(None, "only-if-cached") == {"only-if-cached"}
    assert parse_directives(None, ["no-store"]) == {"no-store"}
    assert parse_directives(None, {"no-cache": True, "no-store": False, "ttl": 60}) == {"no-cache"}
    assert parse_directives(None, None) == frozenset()
    with pytest.raises(InvalidRequestError, match="Unknown cache directive 'bogus'"):
        parse_directives("bogus", None)
    with pytest.raises(InvalidRequestError, match="Invalid 'cache'"):
        parse_directives(None, 3)
