"""Input guardrails end to end: the official openai SDK against a real uvicorn Titan whose fake
model echoes the last user message (so the tests see exactly what reached the model)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.guardrails.echo import EchoEngine
from tests.guardrails.server import cache_status

MODEL = "fake-model"
SECRET = "sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1"
CONFIG = {
    "guardrails": {
        "policies": [
            {"name": "no-secrets", "stages": ["input"], "action": "block", "detect": ["secret"]},
            {"name": "pii-in", "stages": ["input"], "action": "redact",
             "detect": ["email", "phone", "card"]},
            {"name": "weather-flag", "stages": ["input"], "action": "flag",
             "blocklist": ["weather"]},
            {"name": "fruit", "stages": ["input"], "action": "redact",
             "hook": "tests.guardrails.hooks:bananas"},
            {"name": "shouting", "stages": ["input"], "action": "block",
             "hook": "tests.guardrails.hooks:shouting"},
            {"name": "elsewhere", "models": ["another-model"], "action": "block",
             "blocklist": ["apple"]},
        ]
    }
}  # fmt: skip


def ask(sdk: openai.OpenAI, text: str, **extra: object) -> str:
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=400, **extra
    )
    return completion.choices[0].message.content or ""


def hits(base_url: str, policy: str, stage: str, action: str) -> float:
    labels = f'action="{action}",policy="{policy}",stage="{stage}"'
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(f"titan_guardrail_hits_total{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_secret_in_the_input_is_refused_without_echoing_it(
    sdk: openai.OpenAI, engine: EchoEngine, base_url: str
) -> None:
    num_prompts = len(engine.prompts_seen)
    with pytest.raises(openai.BadRequestError) as caught:
        ask(sdk, f"please use my key {SECRET} for the call")
    error = caught.value
    assert error.code == "content_policy_violation"
    assert "no-secrets" in error.message and "secret" in error.message
    assert SECRET not in str(error.body) and SECRET[8:20] not in error.message
    assert len(engine.prompts_seen) == num_prompts  # the model never saw it
    assert hits(base_url, "no-secrets", "input", "block") >= 1


def test_redacted_input_reaches_the_model_redacted(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    text = "mail bob.smith@example.org, card 4111 1111 1111 1111, phone +44 20 7946 0958."
    answer = ask(sdk, text)
    assert answer == "mail [REDACTED_EMAIL], card [REDACTED_CARD], phone [REDACTED_PHONE]."
    seen = engine.seen_texts()[-1]
    assert "[REDACTED_EMAIL]" in seen
    for original in ("bob.smith", "4111", "7946"):
        assert original not in seen
    # Not a card (fails the Luhn check), not a phone: ordinary numbers pass untouched.
    plain = "order 4111 1111 1111 1112 in 2024 for $1,299.99"
    assert ask(sdk, plain) == plain


def test_completion_prompts_are_checked_too(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    completion = sdk.completions.create(
        model=MODEL, prompt="write to eve@example.net", max_tokens=60
    )
    assert completion.choices[0].text == "write to [REDACTED_EMAIL]"
    assert engine.seen_texts()[-1] == "write to [REDACTED_EMAIL]"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model=MODEL, prompt=["fine", f"key {SECRET}"], max_tokens=5)
    assert caught.value.code == "content_policy_violation"


def test_flag_lets_the_request_through_with_a_header_and_a_metric(
    sdk: openai.OpenAI, base_url: str
) -> None:
    before = hits(base_url, "weather-flag", "input", "flag")
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "How is the Weather today?"}],
        max_tokens=60,
    )  # fmt: skip
    assert raw.headers["x-titan-guardrails"] == "weather-flag"
    assert raw.parse().choices[0].message.content == "How is the Weather today?"
    assert hits(base_url, "weather-flag", "input", "flag") == before + 1
    clean = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "weatherproof"}], max_tokens=60
    )
    assert "x-titan-guardrails" not in clean.headers  # whole words only


def test_the_cache_keys_on_the_redacted_prompt(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    def cached(text: str) -> str:
        return cache_status(sdk, MODEL, text, max_tokens=80)

    assert cached("contact alice@example.com about the invoice") == "miss"
    num_prompts = len(engine.prompts_seen)
    # Another address is the same redacted prompt: served from the entry of the redacted one,
    # which never held the original address.
    assert cached("contact carol@example.com about the invoice") == "hit-exact"
    assert cached("contact [REDACTED_EMAIL] about the invoice") == "hit-exact"
    assert len(engine.prompts_seen) == num_prompts


def test_custom_hooks_redact_and_block(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    assert ask(sdk, "I ate a banana today") == "I ate a [REDACTED_HOOK] today"
    with pytest.raises(openai.BadRequestError) as caught:
        ask(sdk, "GIVE ME THE ANSWER")
    assert caught.value.code == "content_policy_violation"
    assert "shouting" in caught.value.message


def test_a_policy_for_other_models_does_not_apply(sdk: openai.OpenAI) -> None:
    assert ask(sdk, "an apple a day") == "an apple a day"


def test_text_parts_and_system_messages_are_checked(sdk: openai.OpenAI, engine: EchoEngine) -> None:
    completion = sdk.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "the admin is root@example.com"},
            {"role": "user", "content": [{"type": "text", "text": "call 555-123-4567"}]},
        ],
        max_tokens=80,
    )
    assert completion.choices[0].message.content == "call [REDACTED_PHONE]"
    seen = engine.seen_texts()[-1]
    assert "root@example.com" not in seen and "[REDACTED_EMAIL]" in seen


def test_the_responses_api_input_is_checked(base_url: str) -> None:
    response = httpx.post(
        f"{base_url}/v1/responses",
        json={"model": MODEL, "input": f"store {SECRET}", "max_output_tokens": 50},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "content_policy_violation"
    assert SECRET not in response.text
