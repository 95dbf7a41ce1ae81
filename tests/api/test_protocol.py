"""Parsing request bodies into the protocol models: lenient about unknown fields, strict about
known ones; and the shapes of what is sent back."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from titan.errors import InvalidRequestError
from titan.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionRequest,
    Usage,
)
from titan.protocol.sse import DONE, KEEP_ALIVE, encode_event

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def first_error(exc: pytest.ExceptionInfo[ValidationError]) -> dict[str, Any]:
    return exc.value.errors(include_url=False)[0]


def test_unknown_fields_are_ignored_and_nulls_mean_default() -> None:
    request = chat(n=None, mirostat=2, extra_body={"x": 1}, temperature=None)
    assert request.n == 1
    assert request.temperature is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "0.5"),
        ("n", True),
        ("n", "2"),
        ("max_tokens", 1.5),
        ("stream", 1),
        ("logprobs", "yes"),
        ("stop", [1]),
        ("stop_token_ids", [-1]),
        ("top_logprobs", 21),
        ("n", 0),
        ("max_completion_tokens", 0),
    ],
)
def test_known_fields_are_type_checked(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        chat(**{field: value})
    assert first_error(exc)["loc"][0] == field


def test_integers_are_accepted_for_floats() -> None:
    assert chat(temperature=1).temperature == 1.0


def test_vllm_sampling_extras_are_parsed() -> None:
    request = chat(
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.1,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[7],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
    )
    assert (request.top_k, request.min_p, request.repetition_penalty) == (5, 0.1, 1.1)
    assert request.min_tokens == 2 and request.ignore_eos and request.stop_token_ids == [7]
    assert request.include_stop_str_in_output and not request.skip_special_tokens


def test_stop_is_a_string_or_a_list_of_at_most_16() -> None:
    assert chat(stop="END").stop == ["END"]
    assert chat(stop=["a", "b"]).stop == ["a", "b"]
    with pytest.raises(ValidationError) as exc:
        chat(stop=["x"] * 17)
    assert "at most 16" in first_error(exc)["msg"]


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=10, max_completion_tokens=20).max_output_tokens == 20
    assert chat(max_tokens=10).max_output_tokens == 10
    assert chat().max_output_tokens is None


def test_content_parts_are_joined_and_other_part_types_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": parts}]}
    )
    assert request.messages[0].text == "a\nb"
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    with pytest.raises(ValidationError) as exc:
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": image}]})
    error = first_error(exc)
    assert error["loc"] == ("messages", 0, "content")
    assert "image_url" in error["msg"] and "only 'text'" in error["msg"]


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool"])
def test_all_roles_parse(role: str) -> None:
    request = ChatCompletionRequest.model_validate({"messages": [{"role": role, "content": "x"}]})
    assert request.messages[0].role == role


def test_content_is_required_except_for_assistant_tool_calls() -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user"}]})
    call = {"role": "assistant", "tool_calls": [{"id": "1", "type": "function"}]}
    request = ChatCompletionRequest.model_validate({"messages": [call]})
    assert request.messages[0].text == ""


def test_top_logprobs_needs_logprobs() -> None:
    with pytest.raises(InvalidRequestError) as exc:
        chat(top_logprobs=3)
    assert exc.value.param == "top_logprobs"
    assert chat(logprobs=True, top_logprobs=3).num_logprobs == 3
    assert chat(logprobs=True).num_logprobs == 0
    assert chat().num_logprobs is None


def test_openai_only_fields_are_accepted() -> None:
    request = chat(
        user="u",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        parallel_tool_calls=True,
        response_format={"type": "text"},
        tool_choice="none",
        seed=3,
        stream_options={"include_usage": True},
        stream=True,
    )
    assert request.include_usage
    with pytest.raises(ValidationError):
        chat(tool_choice="sometimes")
    with pytest.raises(ValidationError):
        chat(response_format={"type": "xml"})


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: list[Any]) -> None:
    assert CompletionRequest.model_validate({"prompt": prompt}).prompts == expected


@pytest.mark.parametrize("prompt", [[], [1, "a"], [True, False], [[1], []], [-1], 5, {"a": 1}])
def test_bad_completion_prompts(prompt: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": prompt})
    assert first_error(exc)["loc"] == ("prompt",)


def test_completion_defaults_and_ranges() -> None:
    request = CompletionRequest.model_validate({"prompt": "x"})
    assert request.max_tokens == 16 and request.echo is False and request.logprobs is None
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "logprobs": 6})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "best_of": 0})


def test_delta_sends_only_what_changed() -> None:
    chunk = ChatCompletionChunk(
        id="chatcmpl-1",
        created=1,
        model="m",
        choices=[ChatChunkChoice(index=0, delta=ChatDelta(content="Hi"))],
    )
    assert b'"delta":{"content":"Hi"}' in encode_event(chunk)


def test_sse_framing() -> None:
    usage = Usage.of(3, 4, 1)
    event = encode_event(usage)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and event.count(b"\n") == 2
    assert b'"total_tokens":7' in event and b'"cached_tokens":1' in event
    assert (
        encode_event({"error": {"message": "a\nb"}}) == b'data: {"error":{"message":"a\\nb"}}\n\n'
    )
    assert DONE == b"data: [DONE]\n\n"
    assert KEEP_ALIVE.startswith(b":")
