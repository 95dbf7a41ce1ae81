"""What the quantized path's reduced-precision attention (``attention_precision: auto``) costs
in quality over a long context, against the same path with float32 attention: one long text
(tests/data/long_context_text.md, written for this and never tuned on) teacher-forced through
both, then perplexity by position range, how often the two agree on the most likely next token,
and the KL divergence between their next-token distributions.

Everything else is the same in both runs (weights, activations, the float16 KV cache), so the
difference is the attention's arithmetic alone. Where the CPU has no reduced unit both runs are
float32 and the numbers say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.forced_logits import all_logits

LONG_TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "long_context_text.md"
RANGES = ((0, 512), (512, 2048), (2048, None))
_CHUNK = 512  # positions compared at a time (a position's log-probabilities are 49k floats)


@dataclass(frozen=True)
class AttentionQuality:
    kind: str  # what the reduced unit computes in ("float32": this CPU has none)
    num_tokens: int
    # "start-end" -> (float32 attention's perplexity, reduced attention's)
    perplexity: dict[str, tuple[float, float]]
    top1_agreement: float  # positions whose most likely next token is the same in both
    mean_kl: float  # KL(float32 || reduced) of the next-token distributions, nats
    p99_kl: float


# 8,192 tokens of cache: the whole text in one prefill (what quality.engine() gives its paths)
_KV_BLOCKS = 512


def _logits(precision: str, max_tokens: int | None) -> tuple[torch.Tensor, list[int], str]:
    """The text's first ``max_tokens`` tokens (all: None), their logits, and what the
    attention computed in."""
    from titan.engine.config import EngineConfig
    from titan.engine.engine import Engine

    engine = Engine(EngineConfig(attention_precision=precision, num_kv_blocks=_KV_BLOCKS))
    try:
        token_ids = engine.tokenizer.encode(LONG_TEXT.read_text())[:max_tokens]
        kind = engine.runner.model.kernels.reduced_attention_kind
        return all_logits(engine, token_ids).clone(), token_ids, kind
    finally:
        engine.close()


def measure(max_tokens: int | None = None) -> AttentionQuality:
    exact, token_ids, _ = _logits("float32", max_tokens)
    reduced, _, kind = _logits("auto", max_tokens)
    targets = torch.tensor(token_ids[1:])
    nll = {"float32": [], "reduced": []}
    agree, kl = [], []
    for start in range(0, len(targets), _CHUNK):
        end = min(start + _CHUNK, len(targets))
        p = torch.log_softmax(exact[start:end].double(), dim=-1)
        q = torch.log_softmax(reduced[start:end].double(), dim=-1)
        rows = torch.arange(end - start)
        nll["float32"].append(-p[rows, targets[start:end]])
        nll["reduced"].append(-q[rows, targets[start:end]])
        agree.append(p.argmax(-1) == q.argmax(-1))
        kl.append((p.exp() * (p - q)).sum(-1))
    losses = {name: torch.cat(parts) for name, parts in nll.items()}
    perplexity = {}
    for low, high in RANGES:
        high = len(targets) if high is None else min(high, len(targets))
        if high > low:
            perplexity[f"{low}-{high}"] = tuple(
                math.exp(losses[name][low:high].mean().item()) for name in ("float32", "reduced")
            )
    kls = torch.cat(kl)
    return AttentionQuality(
        kind=kind,
        num_tokens=len(token_ids),
        perplexity=perplexity,
        top1_agreement=torch.cat(agree).double().mean().item(),
        mean_kl=kls.mean().item(),
        p99_kl=torch.quantile(kls, 0.99).item(),
    )


def render_lines(numbers: dict[str, Any]) -> list[str]:
    """The long-context table of the quality section."""
    lines = [
        f"Long context: tests/data/long_context_text.md ({numbers['num_tokens']} tokens, written "
        "for this by a helper who had not read the code) teacher-forced in one prefill, the "
        f"GGUF blocks path with float32 attention against its default ({numbers['kind']}).",
        "",
        "| positions | perplexity, float32 attention | perplexity, default | change |",
        "|---|---|---|---|",
    ]
    for span, (exact, reduced) in numbers["perplexity"].items():
        lines.append(
            f"| {span} | {exact:.3f} | {reduced:.3f} | {100 * (reduced / exact - 1):+.2f}% |"
        )
    lines += [
        "",
        f"Same most likely next token at {100 * numbers['top1_agreement']:.1f}% of positions; "
        f"KL(float32 || default) per position: mean {numbers['mean_kl']:.4f} nats, "
        f"99th percentile {numbers['p99_kl']:.4f}.",
    ]
    return lines
