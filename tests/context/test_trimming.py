"""Trimming by tokens: the model's own tokenizer and chat template count, the instructions and
the newest turn always stay, whole turns go oldest first, and the result is the most that fits."""

from __future__ import annotations

import pytest

from tests.engine.conftest import hf_dir, tokenizer
from titan.context.trimming import trim, turns
from titan.engine.tokenizer import Tokenizer
from titan.errors import ContextLengthExceededError

__all__ = ["hf_dir", "tokenizer"]

SYSTEM = {"role": "system", "content": "You are a terse assistant for a bicycle shop."}


def counter(tok: Tokenizer):
    def count(messages):  # type: ignore[no-untyped-def]
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        return len(tok.encode(text, add_special_tokens=False))

    return count


def conversation(num_turns: int) -> list[dict]:
    messages = [SYSTEM]
    for i in range(num_turns):
        messages.append({"role": "user", "content": f"Question {i}: how much is part {i * 7}?"})
        messages.append({"role": "assistant", "content": f"Part {i * 7} costs {i + 3} dollars."})
    messages.append({"role": "user", "content": "And the newest question, about brakes?"})
    return messages


def test_a_200_turn_conversation_never_exceeds_the_window_and_keeps_the_system_message(
    tokenizer: Tokenizer,
):
    count = counter(tokenizer)
    budget = 300
    for num_turns in (0, 1, 5, 20, 60, 200):
        messages = conversation(num_turns)
        trimmed = trim(messages, count, budget)
        assert trimmed.num_prompt_tokens == count(trimmed.messages) <= budget  # exact
        assert trimmed.messages[0] == SYSTEM
        assert trimmed.messages[-1] == messages[-1]
        kept_turns = turns(trimmed.messages)[1]
        assert all(turn[0]["role"] == "user" for turn in kept_turns)  # whole turns only
        assert trimmed.messages[1:] == messages[len(messages) - len(trimmed.messages) + 1 :]
        if trimmed.num_dropped_turns:  # the most that fits: one more turn would not
            one_more = [SYSTEM, *messages[-(len(trimmed.messages) + 1) :]]
            assert count(one_more) > budget
        assert trimmed.num_dropped_messages == len(messages) - len(trimmed.messages)


def test_nothing_is_dropped_when_everything_fits(tokenizer: Tokenizer):
    messages = conversation(3)
    trimmed = trim(messages, counter(tokenizer), 10_000)
    assert trimmed.messages == messages and trimmed.num_dropped_turns == 0


def test_a_newest_turn_that_cannot_fit_is_a_400_with_the_counts(tokenizer: Tokenizer):
    messages = [SYSTEM, {"role": "user", "content": "word " * 400}]
    with pytest.raises(ContextLengthExceededError, match=r"takes \d+ tokens and the budget is 50"):
        trim(messages, counter(tokenizer), 50)


def test_turns_group_each_user_message_with_its_answers():
    system, grouped = turns(
        [
            SYSTEM,
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "tool", "content": "c"},
            {"role": "user", "content": "d"},
        ]
    )
    assert system == [SYSTEM]
    assert [[m["content"] for m in turn] for turn in grouped] == [["a", "b", "c"], ["d"]]


def test_headroom_keeps_the_same_prefix_until_the_budget_fills_again(tokenizer: Tokenizer):
    count = counter(tokenizer)
    budget, target = 300, 180
    dropped, prefixes, trims = 0, set(), 0
    for num_turns in range(0, 60):
        messages = conversation(num_turns)
        trimmed = trim(messages, count, budget, keep_dropped=dropped, target=target)
        assert trimmed.num_prompt_tokens == count(trimmed.messages) <= budget
        assert trimmed.messages[0] == SYSTEM and trimmed.messages[-1] == messages[-1]
        assert trimmed.messages[1:] == messages[len(messages) - len(trimmed.messages) + 1 :]
        if trimmed.num_dropped_messages != dropped:  # trimmed again: down to the target
            trims += 1
            assert trimmed.num_prompt_tokens <= target
            one_more = [SYSTEM, *messages[-(len(trimmed.messages) + 1) :]]
            assert count(one_more) > target  # and no further
        dropped = trimmed.num_dropped_messages
        prefixes.add(tuple(m["content"] for m in trimmed.messages[:3]))
    # Without headroom every turn past the window moves the prefix; with it, few do.
    assert 1 < trims < 20 and len(prefixes) <= trims + 2  # + before any trim, + no turn yet


def test_a_stale_drop_point_is_ignored(tokenizer: Tokenizer):
    messages = conversation(40)
    count = counter(tokenizer)
    exact = trim(messages, count, 300)
    # A drop point inside a turn (or past the newest) is no turn boundary: trimming as usual.
    for keep in (1, len(messages) + 5):
        assert trim(messages, count, 300, keep_dropped=keep, target=300) == exact


def test_a_newest_turn_over_the_budget_but_within_the_limit_is_kept_alone(tokenizer: Tokenizer):
    count = counter(tokenizer)
    messages = conversation(5)
    messages[-1] = {"role": "user", "content": "Tell me about brakes. " * 40}
    alone = count([SYSTEM, messages[-1]])
    trimmed = trim(messages, count, alone - 10, limit=alone + 10)
    assert trimmed.messages == [SYSTEM, messages[-1]]
    assert trimmed.num_dropped_turns == 5 and trimmed.num_prompt_tokens == alone
    with pytest.raises(ContextLengthExceededError, match=f"the budget is {alone - 1}"):
        trim(messages, count, alone - 10, limit=alone - 1)
