"""Output guardrails end to end, whole answers and streams: the official openai SDK against a
real uvicorn Titan whose fake model echoes the prompt one character per chunk, so that every
match arrives split across chunks."""

from __future__ import annotations

import httpx
import openai

from tests.guardrails.echo import EchoEngine
from tests.guardrails.server import cache_status
from tests.guardrails.test_guardrails_input import hits

MODEL = "fake-model"
CARD = "4111-1111-1111-1111"
CONFIG = {
    "guardrails": {
        "policies": [
            {"name": "pii-out", "stages": ["output"], "action": "redact",
             "detect": ["email", "phone", "card", "secret"]},
            {"name": "fruit-ban", "stages": ["output"], "action": "block",
             "blocklist": ["forbidden fruit"]},
            {"name": "sunny-flag", "stages": ["output"], "action": "flag", "blocklist": ["sunny"]},
        ]
    }
}  # fmt: skip
TEXT = f"Pay with {CARD} or mail bob@example.com, thanks"
REDACTED = "Pay with [REDACTED_CARD] or mail [REDACTED_EMAIL], thanks"


def chat(sdk: openai.OpenAI, text: str, **extra: object) -> object:
    return sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=400, **extra
    )


def streamed(sdk: openai.OpenAI, text: str, **extra: object) -> tuple[dict, dict, list[str]]:
    """Per choice index: the text and the finish reason; and every content piece as sent."""
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    pieces = []
    for chunk in chat(sdk, text, stream=True, **extra):  # type: ignore[attr-defined]
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    return texts, finishes, pieces


def test_whole_answers_are_redacted(sdk: openai.OpenAI) -> None:
    completion = chat(sdk, TEXT)
    assert completion.choices[0].message.content == REDACTED  # type: ignore[attr-defined]
    assert completion.choices[0].finish_reason == "stop"  # type: ignore[attr-defined]


def test_streams_are_redacted_across_chunk_boundaries(sdk: openai.OpenAI) -> None:
    texts, finishes, pieces = streamed(sdk, TEXT)
    assert texts == {0: REDACTED} and finishes == {0: "stop"}
    assert len(pieces) >= 8  # it streamed word by word (the model sent one character a chunk)
    assert not any("1111" in piece or "bob@" in piece for piece in pieces)


def test_each_choice_of_n_is_guarded(sdk: openai.OpenAI) -> None:
    texts, finishes, _ = streamed(sdk, TEXT, n=2)
    assert texts == {0: REDACTED, 1: REDACTED}
    assert finishes == {0: "stop", 1: "stop"}


def test_a_blocked_answer_stops_with_content_filter(sdk: openai.OpenAI, base_url: str) -> None:
    text = "I love the Forbidden fruit salad"
    completion = chat(sdk, text)
    assert completion.choices[0].message.content == "I love the "  # type: ignore[attr-defined]
    assert completion.choices[0].finish_reason == "content_filter"  # type: ignore[attr-defined]
    texts, finishes, _ = streamed(sdk, text, n=2)
    assert texts == {0: "I love the ", 1: "I love the "}
    assert finishes == {0: "content_filter", 1: "content_filter"}
    assert hits(base_url, "fruit-ban", "output", "block") >= 2
    # A near miss is no match.
    texts, finishes, _ = streamed(sdk, "forbidden fruits are fine")
    assert texts == {0: "forbidden fruits are fine"} and finishes == {0: "stop"}


def test_completion_streams_are_guarded(sdk: openai.OpenAI) -> None:
    stream = sdk.completions.create(
        model=MODEL, prompt="key sk-abcdefghijklmnopqrstuvwxyz0123 ok", max_tokens=100, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == "key [REDACTED_SECRET] ok"


def test_a_blocked_answer_is_not_cached(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    def cache_of(text: str) -> str:
        return cache_status(sdk, MODEL, text, max_tokens=400)

    num_prompts = len(engine.prompts_seen)
    assert cache_of("no forbidden fruit here") == "miss"
    assert cache_of("no forbidden fruit here") == "miss"
    assert len(engine.prompts_seen) == num_prompts + 2
    # Redacted answers are cached as redacted, and replayed so.
    assert cache_of(TEXT) == "miss"
    assert cache_of(TEXT) == "hit-exact"
    again = chat(sdk, TEXT, temperature=0)
    assert again.choices[0].message.content == REDACTED  # type: ignore[attr-defined]


def test_a_blocked_stream_is_not_cached(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    text = "stream the forbidden fruit again"
    for _ in range(2):
        texts, finishes, _ = streamed(sdk, text, temperature=0)
        assert finishes == {0: "content_filter"} and texts == {0: "stream the "}
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=400, temperature=0
    )
    assert raw.headers["x-titan-cache"] == "miss"


def test_flagged_output_has_the_header_and_the_metric(sdk: openai.OpenAI, base_url: str) -> None:
    before = hits(base_url, "sunny-flag", "output", "flag")
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "a sunny day"}], max_tokens=40
    )
    assert raw.headers["x-titan-guardrails"] == "sunny-flag"
    assert raw.parse().choices[0].message.content == "a sunny day"
    streamed(sdk, "sunny again")
    assert hits(base_url, "sunny-flag", "output", "flag") == before + 2


def test_the_metric_is_exported(base_url: str) -> None:
    assert "titan_guardrail_hits_total" in httpx.get(f"{base_url}/metrics").text


def test_responses_api_answers_are_guarded(base_url: str) -> None:
    body = {"model": MODEL, "input": f"card {CARD} then forbidden fruit", "store": False}
    response = httpx.post(f"{base_url}/v1/responses", json=body).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["output"][-1]["content"][0]["text"] == "card [REDACTED_CARD] then "


def test_a_blocked_prompt_of_several_leaves_the_others_streaming(sdk: openai.OpenAI) -> None:
    stream = sdk.completions.create(
        model=MODEL, prompt=["the forbidden fruit", "a plain answer here"], max_tokens=60,
        stream=True,
    )  # fmt: skip
    texts: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert texts == {0: "the ", 1: "a plain answer here"}
    assert finishes == {0: "content_filter", 1: "stop"}
