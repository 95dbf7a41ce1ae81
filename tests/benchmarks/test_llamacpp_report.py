"""The llama.cpp comparison's conversation targets: the median of Titan's conversations."""

from __future__ import annotations

from benchmarks.llamacpp import with_runs
from benchmarks.llamacpp_report import _conversation_text, targets


def _summary(ratio: float) -> dict:
    turns = [{"ttft_s": 1.0}, {"ttft_s": ratio}]
    return {"turns": turns, "first_ttft_s": 1.0, "last_ttft_s": ratio, "ratio": ratio}


def _results(default_ratios: list[float], small_ratios: list[float]) -> dict:
    system = {"at_once": {"tokens_per_s": 10.0}, "single_decode_tokens_per_s": 10.0,
              "long_ttft_s": 1.0, "long_prompt_tokens": 4700}  # fmt: skip
    return {
        "meta": {"settings": {"num_turns": 2, "turn_tokens": 650, "turn_output_tokens": 32}},
        "systems": {
            "titan": {**system, "conversation": with_runs([_summary(r) for r in default_ratios])},
            "titan-2048": {"conversation": with_runs([_summary(r) for r in small_ratios])},
            "llama-server": {**system, "conversation": with_runs([_summary(3.0)])},
        },
    }


def test_the_conversation_targets_take_the_median_of_the_runs():
    results = _results([2.4, 1.7, 1.9], [1.2, 1.3, 2.5])
    rows = {row["check"]: row for row in targets(results)}
    default = rows["last turn's TTFT / first turn's, Titan at its default window, median of 3 "
                   "conversations"]  # fmt: skip
    small = rows["last turn's TTFT / first turn's, Titan at --max-model-len 2048, median of 3 "
                 "conversations"]  # fmt: skip
    assert default["measured"] == 1.9 and default["passed"]
    assert small["measured"] == 1.3 and small["passed"]
    assert not {r["check"]: r for r in targets(_results([2.4, 2.1, 1.9], [1.0]))}[
        "last turn's TTFT / first turn's, Titan at its default window, median of 3 conversations"
    ]["passed"]
    text = _conversation_text(results)
    assert "default window: 2.40x, 1.70x, 1.90x; 2048: 1.20x, 1.30x, 2.50x" in text


def test_one_conversation_is_reported_as_it_was():
    results = _results([2.2], [1.1])
    rows = {row["check"]: row for row in targets(results)}
    assert rows["last turn's TTFT / first turn's, Titan at its default window"]["measured"] == 2.2
    assert "median" not in _conversation_text(results)


def test_the_whole_window_conversations_are_reported_beside_the_targets():
    from benchmarks.llamacpp import FULL_CONVERSATION

    results = _results([1.5, 1.6, 1.7], [1.2])
    results["systems"][FULL_CONVERSATION] = {
        "conversation": with_runs([_summary(r) for r in (2.9, 3.1, 2.4)])
    }
    text = _conversation_text(results)
    assert "TITAN_CONTEXT__CONVERSATION_WINDOW=1048576" in text
    assert "last turn / first 2.90x, 3.10x, 2.40x, median 2.90x" in text
    assert len(targets(results)) == 5  # not a target
