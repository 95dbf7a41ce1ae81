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
    budget: int | None = None  # the prompt tokens trimmed to (None: no window known)


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


def trim(
    messages: Sequence[Message],
    count_tokens: TokenCounter,
    budget: int,
    *,
    keep_dropped: int = 0,
    target: int | None = None,
    limit: int | None = None,
) -> Trimmed:
    """The longest suffix of whole turns that fits ``budget`` prompt tokens with the system
    messages. Raises ContextLengthExceededError (400) when even the newest turn does not fit
    ``limit`` (the model's window, where ``budget`` is a smaller one of the conversation's own;
    default: ``budget``); a newest turn between the two is kept alone.

    With headroom (``target`` below ``budget``): the ``keep_dropped`` first non-system messages
    that the previous request of the conversation dropped stay dropped while the rest fits, so
    the prompt's prefix is the same from turn to turn (an engine's prefix cache reuses it); when
    it no longer fits, turns go until the prompt fits ``target``, leaving room for the turns to
    come."""
    system, grouped = turns(messages)
    target = budget if target is None else min(target, budget)

    def assembled(num_dropped: int) -> list[Message]:
        return system + [m for turn in grouped[num_dropped:] for m in turn]

    newest = len(grouped) - 1 if grouped else 0
    minimal = count_tokens(assembled(newest))
    limit = budget if limit is None else max(limit, budget)
    if minimal > limit:
        raise ContextLengthExceededError(
            f"The newest turn does not fit the context: with the instructions it takes "
            f"{minimal} tokens and the budget is {limit} (the window minus max_output_tokens "
            "and a reserve). Shorten the input or lower max_output_tokens."
        )
    if minimal > budget:  # longer than the conversation may keep: the newest turn alone
        return _trimmed(grouped, assembled(newest), minimal, newest)
    sticky = _turns_in(grouped, keep_dropped) if target < budget else 0
    kept = count_tokens(assembled(sticky))
    if kept <= budget:
        return _trimmed(grouped, assembled(sticky), kept, sticky)
    if minimal > target:  # only the newest turn fits, and not with headroom
        return _trimmed(grouped, assembled(newest), minimal, newest)
    # Fewest turns dropped that fit the target: token counts fall as more old turns go, so
    # bisect between what still does not fit and the newest turn alone (which does).
    low, high = sticky + 1, newest
    fitted = {newest: minimal}
    while low < high:
        middle = (low + high) // 2
        tokens = count_tokens(assembled(middle))
        if tokens <= target:
            high = middle
            fitted[middle] = tokens
        else:
            low = middle + 1
    tokens = fitted.get(high)
    if tokens is None:
        tokens = count_tokens(assembled(high))
    return _trimmed(grouped, assembled(high), tokens, high)


def _turns_in(grouped: list[list[Message]], num_messages: int) -> int:
    """How many whole turns the first ``num_messages`` messages are (0 unless they end on a
    turn boundary before the newest turn)."""
    total = 0
    for index, turn in enumerate(grouped[:-1]):
        total += len(turn)
        if total == num_messages:
            return index + 1
        if total > num_messages:
            break
    return 0


def _trimmed(
    grouped: list[list[Message]], kept: list[Message], tokens: int, num_dropped: int
) -> Trimmed:
    num_dropped_messages = sum(len(turn) for turn in grouped[:num_dropped])
    return Trimmed(kept, tokens, num_dropped, num_dropped_messages)
