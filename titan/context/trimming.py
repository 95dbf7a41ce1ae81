"""Token-aware trimming of a conversation to the model's window.

The budget is the context window minus the output tokens asked for minus a reserve. System
messages (the instructions) and the newest turn always stay; the oldest turns go first, each a
whole user turn with the assistant and tool messages that answered it. Tokens are counted by the
caller's counter: the model's own tokenizer and chat template where Titan has them (the embedded
engine), so "fits" means fits, not "about fits".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from titan.errors import ContextLengthExceededError

Message = dict[str, Any]
TokenCounter = Callable[[list[Message]], int]


@dataclass(frozen=True)
class Trimmed:
    messages: list[Message]
    num_prompt_tokens: int
    num_dropped_turns: int
    num_dropped_messages: int


def turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """(system messages, turns): a turn starts at a user message and runs to the next one."""
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    rest = [m for m in messages if m.get("role") not in ("system", "developer")]
    grouped: list[list[Message]] = []
    for message in rest:
        if message.get("role") == "user" or not grouped:
            grouped.append([message])
        else:
            grouped[-1].append(message)
    return system, grouped


def trim(messages: Sequence[Message], count_tokens: TokenCounter, budget: int) -> Trimmed:
    """The longest suffix of whole turns that fits ``budget`` prompt tokens with the system
    messages. Raises ContextLengthExceededError (400) when even the newest turn does not fit."""
    system, grouped = turns(messages)

    def assembled(num_dropped: int) -> list[Message]:
        return system + [m for turn in grouped[num_dropped:] for m in turn]

    newest = len(grouped) - 1 if grouped else 0
    minimal = count_tokens(assembled(newest))
    if minimal > budget:
        raise ContextLengthExceededError(
            f"The newest turn does not fit the context: with the instructions it takes "
            f"{minimal} tokens and the budget is {budget} (the window minus max_output_tokens "
            "and a reserve). Shorten the input or lower max_output_tokens."
        )
    whole = count_tokens(assembled(0))
    if whole <= budget:
        return Trimmed(assembled(0), whole, 0, 0)
    # Fewest turns dropped that fit: token counts fall as more old turns go, so bisect.
    low, high = 1, newest  # high fits (checked above), 0 does not
    fitted = {newest: minimal}
    while low < high:
        middle = (low + high) // 2
        tokens = count_tokens(assembled(middle))
        if tokens <= budget:
            high = middle
            fitted[middle] = tokens
        else:
            low = middle + 1
    kept = assembled(high)
    tokens = fitted.get(high)
    if tokens is None:
        tokens = count_tokens(kept)
    num_dropped_messages = sum(len(turn) for turn in grouped[:high])
    return Trimmed(kept, tokens, high, num_dropped_messages)
