"""Guarding text that arrives in pieces: whatever the chunking, the client gets what the whole
text would have given, and a tail is held back only while it could still become a match."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from titan.config.guardrails import GuardrailsConfig
from titan.service.guard_policies import build_policies
from titan.service.guard_text import ChoiceScanner, Outcome, apply, scan

POLICIES = build_policies(
    GuardrailsConfig.model_validate(
        {
            "policies": [
                {"name": "pii", "action": "redact",
                 "detect": ["email", "phone", "card", "secret"]},
                {"name": "words", "action": "block", "blocklist": ["forbidden fruit"]},
                {"name": "ids", "action": "redact", "patterns": [r"ID-\d{6}"], "hold_chars": 9},
            ]
        }
    )
)  # fmt: skip
SENSITIVE = [
    "bob@example.com", "4111 1111 1111 1111", "5500-0000-0000-0004", "+44 20 7946 0958",
    "sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1", "ghp_" + "Ab1" * 12, "ID-123456",
]  # fmt: skip


def run(pieces: list[str], policies: tuple = POLICIES) -> tuple[list[Outcome], Outcome]:
    async def feed() -> tuple[list[Outcome], Outcome]:
        scanner = ChoiceScanner(policies, "output", "m")
        outcomes = []
        for piece in pieces:
            outcome = await scanner.feed(piece, is_final=False)
            outcomes.append(outcome)
            if outcome.blocked_by is not None:
                return outcomes, outcome
        final = await scanner.feed("", is_final=True)
        return outcomes, final

    return asyncio.run(feed())


def whole(text: str) -> Outcome:
    return apply(text, asyncio.run(scan(POLICIES, text, "output", "m")))


def streamed_text(pieces: list[str]) -> tuple[str, bool]:
    outcomes, final = run(pieces)
    if final.blocked_by is None:  # else the final outcome is the last one fed
        outcomes.append(final)
    return "".join(o.text for o in outcomes), final.blocked_by is not None


def test_only_what_could_still_match_is_held_back() -> None:
    pieces = ["Hello world, ", "the year ", "is 2024. Mail ", "bo", "b@exa", "mple.com", " ok"]
    outcomes, final = run(pieces, POLICIES[:2])  # built-in detectors and a blocklist
    assert [o.text for o in outcomes] == [
        "Hello world, ", "the year ", "is 2024. Mail ", "", "", "", "[REDACTED_EMAIL] ",
    ]  # fmt: skip
    assert final.text == "ok"
    # A regex pattern holds back a fixed tail (its hold_chars).
    outcomes, _ = run(["order ID-12", "3456 shipped today"], POLICIES[2:])
    assert [o.text for o in outcomes] == ["or", "der [REDACTED_PATTERN] ship"]


def test_a_block_mid_stream_stops_before_the_phrase() -> None:
    text, is_blocked = streamed_text(list("we ate the Forbidden fruit today"))
    assert (text, is_blocked) == ("we ate the ", True)


text_pieces = st.lists(
    st.one_of(st.sampled_from(SENSITIVE), st.text(alphabet="ab Z09.,-@+", max_size=10)),
    max_size=8,
)


@settings(max_examples=120, deadline=None)
@given(text_pieces, st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30))
def test_any_chunking_gives_the_whole_texts_result(parts: list[str], sizes: list[int]) -> None:
    text = " ".join(parts)
    pieces, position, index = [], 0, 0
    while position < len(text):
        size = sizes[index % len(sizes)]
        pieces.append(text[position : position + size])
        position, index = position + size, index + 1
    streamed, is_blocked = streamed_text(pieces)
    expected = whole(text)
    assert streamed == expected.text
    assert is_blocked == (expected.blocked_by is not None)
    for secret in SENSITIVE:
        assert secret not in streamed
