"""Custom guardrail hooks the tests name in their configs (``tests.guardrails.hooks:...``)."""

from __future__ import annotations

import re


def bananas(text: str, *, stage: str, model: str) -> list[tuple[int, int]]:
    """Spans of the word 'banana' (a stand-in for a user's moderation check)."""
    return [(m.start(), m.end()) for m in re.finditer(r"banana", text)]


async def shouting(text: str, *, stage: str, model: str) -> bool:
    """An async hook judging the whole text: all capitals is not allowed on input."""
    return stage == "input" and len(text) > 3 and text.isupper()


def broken(text: str, *, stage: str, model: str) -> bool:
    raise RuntimeError("the moderation service is down")


NOT_CALLABLE = 42
