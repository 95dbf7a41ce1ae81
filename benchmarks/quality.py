"""What running a GGUF file's own quantized blocks costs in quality, against the float path on the
same weights (the blocks dequantized to float32, which is what Titan ran before):

- greedy agreement: the same chat prompts, greedy; how many leading tokens each path's answer
  shares with the float path's, and how many answers are identical;
- perplexity on a text shipped with the tests (tests/data/perplexity_text.md), teacher-forced;
- over a long context, the default (reduced-precision) attention against float32 attention
  (benchmarks/attention_quality.py).

Differences come from the activations, quantized to int8 per block of 32 before each matmul (as
llama.cpp does): the weights are the same numbers in both paths. ``python -m benchmarks quality``
writes the numbers; tests/engine/test_quantized_quality.py holds them to bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import attention_quality
from benchmarks.base import Benchmark
from benchmarks.forced_logits import all_logits
from benchmarks.results_file import quick_note

TEXT = Path(__file__).resolve().parents[1] / "tests" / "data" / "perplexity_text.md"
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Give me a tip for learning to cook.",
    "What does a compiler do?",
    "Describe a rainy afternoon in a city.",
    "Why do leaves change colour in autumn?",
    "Suggest a name for a friendly robot.",
    "How many legs does a spider have?",
    "Write one sentence about the moon.",
    "What is the difference between weather and climate?",
    "Tell me a short joke about computers.",
    "How do you make a cup of tea?",
    "What is a prime number?",
    "Summarise the plot of Cinderella in two sentences.",
    "Name three colours of the rainbow.",
    "What should I pack for a day hike?",
    "Explain what a database index is.",
    "Why is the sky blue?",
    "Write a limerick about a cat.",
    "What are the benefits of regular exercise?",
    "How does a bicycle stay upright?",
    "Give an example of a renewable energy source.",
)
NEW_TOKENS = 48


@dataclass(frozen=True)
class Quality:
    mean_shared_prefix: float  # leading tokens each answer shares with the float path's, / tokens
    identical_answers: float  # share of answers identical to the float path's
    perplexity: float
    float_perplexity: float


def engine(path: str) -> Any:
    """``none``: the float32 path; ``bfloat16``: torch in bfloat16; ``auto``: the file's own
    blocks; ``q8_0``: every matmul requantized to Q8_0."""
    from titan.engine.config import EngineConfig
    from titan.engine.engine import Engine

    dtype = {"none": "float32", "bfloat16": "bfloat16"}.get(path, "auto")
    quantization = "none" if path in ("none", "bfloat16") else path
    return Engine(EngineConfig(dtype=dtype, quantization=quantization, num_kv_blocks=512))


def greedy_answers(engine: Any, prompts: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    from titan.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        engine.add_request(f"q{index}", engine.tokenizer.encode(text), params)
    answers: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for output in engine.step():
            answers.setdefault(output.request_id, []).extend(output.token_ids)
    return [answers[f"q{index}"] for index in range(len(prompts))]


def teacher_forced_perplexity(engine: Any, token_ids: list[int]) -> float:
    """exp(mean negative log-likelihood) of each token given the ones before it."""
    logits = all_logits(engine, token_ids)
    log_probs = torch.log_softmax(logits[:-1].double(), dim=-1)
    targets = torch.tensor(token_ids[1:])
    nll = -log_probs[torch.arange(len(targets)), targets].mean().item()
    return math.exp(nll)


def shared_prefix(a: list[int], b: list[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


@dataclass(frozen=True)
class Reference:
    """The float path's answers and perplexity."""

    answers: list[list[int]]
    perplexity: float


def run_path(quantization: str, prompts: tuple[str, ...] = PROMPTS) -> Reference:
    """One path's perplexity (first: it writes KV blocks directly, before the prefix cache holds
    anything) and greedy answers."""
    path = engine(quantization)
    try:
        perplexity = teacher_forced_perplexity(path, path.tokenizer.encode(TEXT.read_text()))
        return Reference(greedy_answers(path, prompts), perplexity)
    finally:
        path.close()


def measure(
    quantization: str = "auto",
    reference: Reference | None = None,
    prompts: tuple[str, ...] = PROMPTS,
) -> Quality:
    """A path (``auto``: the file's blocks; ``q8_0``; ``bfloat16``) against the float path."""
    reference = reference or run_path("none", prompts)
    quantized = run_path(quantization, prompts)
    shared = [
        shared_prefix(a, b) / NEW_TOKENS
        for a, b in zip(quantized.answers, reference.answers, strict=True)
    ]
    return Quality(
        mean_shared_prefix=float(np.mean(shared)),
        identical_answers=float(np.mean([s == 1.0 for s in shared])),
        perplexity=quantized.perplexity,
        float_perplexity=reference.perplexity,
    )


NAME = "quantized-quality"
PATHS = {
    "bfloat16": "torch, bfloat16 weights",
    "auto": "GGUF Q4_1 blocks, int8 activations, default attention (the default)",
    "q8_0": "every matmul requantized to Q8_0, int8 activations",
}


@dataclass(frozen=True)
class Settings:
    num_prompts: int = len(PROMPTS)
    long_context_tokens: int | None = None  # None: the whole long text
    is_quick: bool = False

    @classmethod
    def quick(cls, **overrides: Any) -> Settings:
        settings = cls(num_prompts=4, long_context_tokens=600, is_quick=True)
        return replace(settings, **overrides)


def run(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    prompts = PROMPTS[: settings.num_prompts]
    progress("the float32 path")
    reference = run_path("none", prompts)
    paths = {}
    for path in PATHS:
        progress(PATHS[path])
        paths[path] = measure(path, reference, prompts).__dict__
    progress("a long context, float32 attention against the default")
    long_context = attention_quality.measure(settings.long_context_tokens)
    return {"paths": paths, "long_context": long_context.__dict__}


def _machine(meta: dict[str, Any]) -> str:
    machine = meta.get("machine", {})
    return f"{machine.get('cpu_model', 'an unknown CPU')}, {machine.get('num_cores', '?')} cores"


def render_markdown(results: dict[str, Any], json_name: str = "") -> str:
    meta, paths = results["meta"], results["paths"]
    float_perplexity = next(iter(paths.values()))["float_perplexity"]
    lines = [
        f"<!-- {NAME}-bench:start -->",
        "## Quality of the quantized path (`python -m benchmarks quality`)",
        "",
        *quick_note(meta),
        f"Measured {meta['started_at']} with `{meta['command']}` on {_machine(meta)}. Every "
        "path runs the same "
        "weights: SmolLM2-135M-Instruct's Q4_1 file, whose blocks the float path dequantizes to "
        f"float32. {meta['settings']['num_prompts']} chat prompts, {NEW_TOKENS} greedy tokens "
        "each, compared with the float path's answers; perplexity teacher-forced on "
        f"tests/data/perplexity_text.md (float32 path: {float_perplexity:.3f}).",
        "",
        "| path | perplexity | vs float32 | tokens shared with float32's | identical answers |",
        "|---|---|---|---|---|",
    ]
    for path, numbers in paths.items():
        lines.append(
            f"| {PATHS[path]} | {numbers['perplexity']:.3f} | "
            f"{100 * (numbers['perplexity'] / float_perplexity - 1):+.2f}% | "
            f"{100 * numbers['mean_shared_prefix']:.0f}% | "
            f"{100 * numbers['identical_answers']:.0f}% |"
        )
    if "long_context" in results:
        lines += ["", *attention_quality.render_lines(results["long_context"])]
    if json_name:
        lines += ["", f"Raw numbers: `{json_name}`."]
    lines += ["", f"<!-- {NAME}-bench:end -->"]
    return "\n".join(lines)


BENCHMARK = Benchmark(NAME, run, render_markdown, packages=("torch", "titan"))
