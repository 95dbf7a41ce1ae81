"""The built-in detectors: what they find, what they must not find, and redaction."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titan.service.guard_detectors import (
    BlocklistDetector,
    CardDetector,
    EmailDetector,
    PhoneDetector,
    SecretDetector,
    luhn_valid,
    merge,
    redact,
)

DETECTORS = (EmailDetector(), PhoneDetector(), CardDetector(), SecretDetector())


def found(detector: object, text: str) -> list[str]:
    return [text[f.start : f.end] for f in detector.find(text)]  # type: ignore[attr-defined]


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112") and not luhn_valid("79927398710")


@pytest.mark.parametrize(
    "text, cards",
    [
        ("visa 4111 1111 1111 1111 ok", ["4111 1111 1111 1111"]),
        ("mc 5500-0000-0000-0004.", ["5500-0000-0000-0004"]),
        ("amex 378282246310005", ["378282246310005"]),
        ("19 digits 6011000990139424 then", ["6011000990139424"]),
        ("card 4111111111111111 2025", ["4111111111111111"]),  # a year after it stays out
        ("not luhn 4111 1111 1111 1112", []),
        ("too short 4111 1111 111", []),
        ("order id 123456789012 and ts 1700000000000", []),
    ],
)
def test_cards_need_13_to_19_luhn_valid_digits(text: str, cards: list[str]) -> None:
    assert found(CardDetector(), text) == cards


@pytest.mark.parametrize(
    "text, phones",
    [
        ("call +1 (555) 123-4567 now", ["+1 (555) 123-4567"]),
        ("uk +44 20 7946 0958", ["+44 20 7946 0958"]),
        ("fr +33 6 12 34 56 78", ["+33 6 12 34 56 78"]),
        ("de 030 1234567 or 0612345678", ["030 1234567", "0612345678"]),
        ("us (555) 123-4567, 555.123.4567", ["(555) 123-4567", "555.123.4567"]),
        ("in 2024 we sold 1,299 units at $19.99", []),
        ("dates 2024-01-15 and 01-02-2024", []),
        ("id 5551234567 and version 3.11.7", []),
    ],
)
def test_phones_and_ordinary_numbers(text: str, phones: list[str]) -> None:
    assert found(PhoneDetector(), text) == phones


def test_emails() -> None:
    text = "to john.doe+tag@mail.example.co.uk, (x@y.io); not me@localhost or @handle or a@b.c"
    assert found(EmailDetector(), text) == ["john.doe+tag@mail.example.co.uk", "x@y.io"]


@pytest.mark.parametrize(
    "secret",
    [
        "sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1",
        "sk-abcdefghijklmnopqrstuvwxyz0123",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "Ab1" * 12,
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        "xoxb-1234567890-abcdefghij",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc",
        "q8Lm2Xv9Tz4Kp7Wn3Rb6Yc1Hd5Jf0Ga8Se2Uo",  # a generic random token
    ],
)
def test_secrets(secret: str) -> None:
    assert found(SecretDetector(), f"use {secret} here") == [secret]


@pytest.mark.parametrize(
    "text",
    [
        "the sk- prefix and task-management are words",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",  # a hex digest
        "id 550e8400-e29b-41d4-a716-446655440000",  # a UUID
        "internationalizationAndLocalizationSupport",  # long, but a word
        "Bearer token",
    ],
)
def test_secret_near_misses(text: str) -> None:
    assert found(SecretDetector(), text) == []


def test_blocklist_is_case_insensitive_and_whole_word() -> None:
    detector = BlocklistDetector(["bad word", "class"])
    text = "a BAD   word, classy, Class."
    assert found(detector, text) == ["BAD   word", "Class"]
    assert detector.hold_from("this is a ba") == len("this is a ")
    assert detector.hold_from("this is bad w") == len("this is ")
    assert detector.hold_from("abad") == 4  # inside a word: no phrase can start there


def test_redaction_names_the_kind() -> None:
    text = "mail a.b@example.com or card 4111 1111 1111 1111"
    findings = [f for d in DETECTORS for f in d.find(text)]
    assert redact(text, findings) == "mail [REDACTED_EMAIL] or card [REDACTED_CARD]"


# Pieces of text, some of them sensitive, joined in any order with any separators.
SENSITIVE = [
    "bob@example.com", "4111 1111 1111 1111", "+44 20 7946 0958",
    "sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1", "AKIAIOSFODNN7EXAMPLE",
]  # fmt: skip
pieces = st.lists(
    st.one_of(
        st.sampled_from(SENSITIVE),
        st.text(alphabet="abc XYZ019.,-@+()", max_size=12),
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(pieces, st.sampled_from([" ", "\n", ", ", " and "]))
def test_redaction_removes_every_detected_span(parts: list[str], separator: str) -> None:
    text = separator.join(parts)
    findings = [f for d in DETECTORS for f in d.find(text)]
    redacted = redact(text, findings)
    assert redacted.count("[REDACTED_") == len(merge(findings))  # one placeholder a span
    for secret in SENSITIVE:
        if secret in parts:
            assert secret not in redacted
    assert not [f for d in DETECTORS for f in d.find(redacted)]  # placeholders match nothing


def test_non_latin_text_around_matches() -> None:
    text = "密钥sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1，邮件bob@example.com。"
    assert found(SecretDetector(), text) == ["sk-proj-Zx81QmT4vB7nL2pR9sK3wY6cF0dH5jA1"]
    assert found(EmailDetector(), text) == ["bob@example.com"]
    # A run of CJK text could not become a key or an address: nothing is held back.
    chinese = "这是一个很长的句子没有空格"
    assert SecretDetector().hold_from(chinese) == EmailDetector().hold_from(chinese) == len(chinese)
    # Digits of other scripts are no card number (the Luhn check reads ASCII digits).
    assert found(CardDetector(), "٤١١١١١١١١١١١١١١١") == []
