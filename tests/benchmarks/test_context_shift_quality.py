"""The context shift quality measure's arithmetic and its report lines (no model)."""

from __future__ import annotations

from benchmarks.context_shift_quality import _agreement
from benchmarks.llamacpp_report import _shift_quality_lines, _slowest_turns


def test_agreement_counts_identical_answers_and_the_shared_start():
    pairs = [([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2, 3, 4], [1, 9, 3, 4]), ([5, 6, 7, 8], [0] * 4)]
    assert _agreement(pairs) == {"identical": 1 / 3, "common_prefix": (1 + 0.25 + 0) / 3}


def test_the_report_reads_shifted_against_exact_and_trimming_against_untrimmed():
    case = {"shifted_tokens": 300, "prompt_tokens": 400}
    quality = {
        "num_cases": 2, "answer_tokens": 32, "cases": [case, case],
        "shifted_vs_exact": {"identical": 0.5, "common_prefix": 0.75},
        "exact_vs_untrimmed": {"identical": 0.25, "common_prefix": 0.5},
        "shifted_vs_untrimmed": {"identical": 0.0, "common_prefix": 0.4},
    }  # fmt: skip
    text = "\n".join(_shift_quality_lines(quality))
    assert "75% of the trimmed prompts' tokens were moved" in text
    assert "| shifted vs exact (what context shift changes) | 50% | 75% |" in text
    assert "| exact vs untrimmed (what trimming itself changes) | 25% | 50% |" in text
    assert _shift_quality_lines(None) == []


def test_the_slowest_turn_is_reported_against_the_first_for_every_server():
    def conversation(*ttfts: float) -> dict:
        return {"conversation": {"turns": [{"ttft_s": t} for t in ttfts]}}

    systems = {"titan": conversation(0.5, 1.5, 1.0), "titan-2048": conversation(0.4, 0.4),
               "llama-server": conversation(2.0, 3.0, 5.0)}  # fmt: skip
    assert _slowest_turns(systems) == (
        "Slowest turn's TTFT / first turn's (not a target): Titan 3.00x (turn 2), "
        "Titan at 2048 1.00x (turn 1), llama-server 2.50x (turn 3)."
    )
