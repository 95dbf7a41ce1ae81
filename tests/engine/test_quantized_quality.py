"""The quantized path's quality against the float path on the same weights (benchmarks/quality.py
measures the whole set; bench/RESULTS.md has its numbers): perplexity on the shipped text within
2% of the float path's, and greedy answers that mostly begin the same way. A broken kernel (a
wrong activation, a misplaced block) fails both at once."""

from __future__ import annotations

import pytest

from benchmarks import quality

pytestmark = pytest.mark.slow


def test_the_gguf_blocks_path_keeps_the_float_paths_quality():
    measured = quality.measure("auto", prompts=quality.PROMPTS[:12])
    assert measured.perplexity <= 1.02 * measured.float_perplexity, measured
    # Measured 0.57 over the 24 prompts (bfloat16: 0.78): int8 activations move near-ties.
    assert measured.mean_shared_prefix >= 0.25, measured


def test_reduced_attention_keeps_float32_attentions_quality_over_a_long_context():
    """The default attention (int8 or bfloat16 arithmetic, where the CPU has a unit for it)
    against float32 attention on the same path, 1,500 tokens of a text never tuned on:
    bench/RESULTS.md has the whole text's numbers."""
    from benchmarks import attention_quality

    measured = attention_quality.measure(1500)
    if measured.kind == "float32":
        pytest.skip("this CPU has no reduced-precision attention unit: both runs are float32")
    # A span's perplexity is a mean over its ~500-1,000 positions: one standard error of the
    # change is ~0.45% there (paired per position), so this bound catches a broken unit, not
    # rounding (the int8 unit's two ways of summing values measured +0.3% and +1.0% on 0-512).
    for span, (exact, reduced) in measured.perplexity.items():
        assert abs(reduced / exact - 1) < 0.02, (span, measured)
    # The finer measures, per position. Measured: AMX tiles 97% agreement, mean KL 0.0024 nats
    # (the whole text); the int8 unit with float32 values 96.5%, 0.0035 (these 1,500 tokens).
    assert measured.top1_agreement >= 0.9, measured
    assert measured.mean_kl < 0.01, measured
