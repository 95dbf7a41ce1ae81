"""What context shift costs in answers: the same trimmed conversation answered with the kept
turns' KV moved (context shift) and recomputed exactly, greedy, on the embedded engine in this
process (its default weights and kernels).

Each case is a conversation of user turns (the conversation benchmark's notes and question), with
the engine's own greedy replies. The last request before the new turn is computed in full; the
new turn drops the oldest turns and is answered three ways: *shifted* (what Titan does by
default), *exact* (trimmed, recomputed), *untrimmed* (the whole history, no trimming at all).
Shifted against exact is what the approximation changes; exact against untrimmed is what
trimming itself changes, the scale to read the first against.
"""

from __future__ import annotations

from typing import Any

from benchmarks.llamacpp_load import conversation_turns

SYSTEM = {"role": "system", "content": "Answer in one sentence."}


def measure(
    num_cases: int = 12, turns_per_case: int = 6, tokens_per_turn: int = 300,
    answer_tokens: int = 32, seed: int = 100,
) -> dict[str, Any]:  # fmt: skip
    from titan.engine.config import EngineConfig
    from titan.engine.engine import Engine

    engine = Engine(EngineConfig())
    try:
        cases = [
            _case(engine, index, conversation_turns(seed + index, turns_per_case, tokens_per_turn),
                  answer_tokens)
            for index in range(num_cases)
        ]  # fmt: skip
    finally:
        engine.close()
    return {
        "num_cases": num_cases,
        "answer_tokens": answer_tokens,
        "cases": cases,
        "shifted_vs_exact": _agreement([(c["shifted"], c["exact"]) for c in cases]),
        "exact_vs_untrimmed": _agreement([(c["exact"], c["untrimmed"]) for c in cases]),
        "shifted_vs_untrimmed": _agreement([(c["shifted"], c["untrimmed"]) for c in cases]),
    }


def _case(engine: Any, index: int, turns: list[str], answer_tokens: int) -> dict[str, Any]:
    from titan.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=answer_tokens, temperature=0, ignore_eos=True)
    scope = f"case{index}"  # as /v1/responses: one scope for the whole conversation
    history: list[dict[str, str]] = [SYSTEM]
    for text in turns[:-1]:  # the engine's own replies, the whole history each time
        history.append({"role": "user", "content": text})
        reply = _generate(engine, f"case{index}-{len(history)}", history, params, scope)
        history.append({"role": "assistant", "content": engine.tokenizer.decode(reply)})
    new_turn = {"role": "user", "content": turns[-1]}
    num_dropped = 1 + index % 3  # oldest user turns (with their replies) left out
    trimmed = [SYSTEM, *history[1 + 2 * num_dropped :], new_turn]
    before = engine.stats().num_shifted_tokens
    shifted = _generate(engine, f"case{index}-shifted", trimmed, params, scope)
    num_shifted = engine.stats().num_shifted_tokens - before
    return {
        "dropped_turns": num_dropped,
        "prompt_tokens": len(_prompt(engine, trimmed)),
        "shifted_tokens": num_shifted,
        "shifted": shifted,
        "exact": _generate(engine, f"case{index}-exact", trimmed, params, None),
        "untrimmed": _generate(engine, f"case{index}-full", [*history, new_turn], params, None),
    }


def _prompt(engine: Any, messages: list[dict[str, str]]) -> list[int]:
    tokenizer = engine.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def _generate(
    engine: Any, request_id: str, messages: list[dict[str, str]], params: Any, scope: str | None
) -> list[int]:
    engine.add_request(request_id, _prompt(engine, messages), params, shift_scope=scope)
    tokens: list[int] = []
    while engine.has_unfinished:
        for output in engine.step():
            tokens.extend(output.token_ids)
    return tokens


def _agreement(pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """Share of identical answers, and of tokens before the first difference."""
    same = sum(a == b for a, b in pairs)
    prefix = [_common_prefix(a, b) / len(a) for a, b in pairs]
    return {"identical": same / len(pairs), "common_prefix": sum(prefix) / len(prefix)}


def _common_prefix(a: list[int], b: list[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))
