"""`python -m benchmarks structured`: what constrained decoding costs the embedded engine.

A batch of ``num_requests`` chat requests (same prompts, same max_tokens, seeded sampling) runs
twice per round: with no request constrained, then with every other request constrained by a
JSON schema. Reported: the decode throughput of full-batch steps (every request decoding; the
number that says what masks cost per step), end-to-end tokens/s, both as medians over rounds;
and the schema compile time, first (a schema never seen) and cached.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import SamplingParams, StructuredOutput

SUBJECTS = [
    "Paris", "the ocean", "a cat", "Rome", "bread", "quantum physics", "Japan", "the moon",
    "photosynthesis", "the stock market", "a haunted house", "football", "Egypt", "rain",
    "a robot", "volcanoes", "chess", "coffee", "the piano", "bees", "Mars", "tea", "a bicycle",
    "winter", "the internet", "dinosaurs", "Mount Everest", "a library", "jazz", "the sun",
    "a forest", "sharks",
]  # fmt: skip

# Long strings allowed, so constrained requests keep decoding about as long as free ones.
SCHEMA = {
    "type": "object",
    "properties": {
        "subject": {"type": "string", "maxLength": 40},
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 200}},
        "is_true": {"type": "boolean"},
    },
    "required": ["subject", "facts", "is_true"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class StructuredBenchSettings:
    num_requests: int = 32
    max_tokens: int = 64
    num_rounds: int = 3
    num_compiles: int = 5
    dtype: str = "auto"
    num_threads: int | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **overrides: Any) -> StructuredBenchSettings:
        return replace(
            cls(num_requests=4, max_tokens=24, num_rounds=1, num_compiles=2), **overrides
        )


def _prompts(engine: Engine, num_requests: int) -> list[list[int]]:
    tokenizer = engine.tokenizer
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"Give facts about {subject} as JSON."}]
            )
        )
        for subject in (SUBJECTS * (num_requests // len(SUBJECTS) + 1))[:num_requests]
    ]


def run_batch(engine: Engine, prompts: list[list[int]], constrained: bool, settings) -> dict:
    """One batch; with ``constrained``, every other request follows SCHEMA."""
    structured = StructuredOutput("json_schema", json.dumps(SCHEMA))
    for index, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=0.8,
            seed=settings.seed + index,
            ignore_eos=True,  # free requests run to max_tokens; constrained ones to their end
            structured=structured if constrained and index % 2 else None,
        )
        engine.add_request(f"r{index}", prompt, params)
    num_tokens = 0
    full_step_s: list[float] = []
    started = time.perf_counter()
    while engine.has_unfinished:
        is_full = len(engine.scheduler.running) == len(prompts) and not engine.scheduler.waiting
        step_started = time.perf_counter()
        outputs = engine.step()
        step_s = time.perf_counter() - step_started
        # A full-batch decode step: every request samples one token.
        if is_full and len(outputs) == len(prompts) and all(len(o.token_ids) == 1 for o in outputs):
            full_step_s.append(step_s)
        num_tokens += sum(len(o.token_ids) for o in outputs)
    wall_s = time.perf_counter() - started
    return {
        "num_tokens": num_tokens,
        "tokens_per_s": num_tokens / wall_s,
        "full_batch_tokens_per_s": (
            len(prompts) / statistics.median(full_step_s) if full_step_s else None
        ),
        "num_full_steps": len(full_step_s),
    }


def time_compiles(engine: Engine, num_compiles: int) -> dict[str, float]:
    """Milliseconds to compile a schema never seen before, and the same schema again."""
    first, cached = [], []
    for index in range(num_compiles):
        schema = {**SCHEMA, "properties": {**SCHEMA["properties"], f"extra{index}": {}}}
        structured = StructuredOutput("json_schema", json.dumps(schema))
        started = time.perf_counter()
        engine.grammars.compile(structured)
        first.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        engine.grammars.compile(structured)
        cached.append((time.perf_counter() - started) * 1e3)
    return {"first_ms": statistics.median(first), "cached_ms": statistics.median(cached)}


def run(settings: StructuredBenchSettings, progress: Callable[[str], None]) -> dict[str, Any]:
    """Compile times, then the rounds of both batches; their medians and the slowdown."""
    import torch

    engine = Engine(EngineConfig(dtype=settings.dtype, num_threads=settings.num_threads))
    try:
        prompts = _prompts(engine, settings.num_requests)
        progress("warm-up")
        # The tokenizer conversion for llguidance (once per engine) is timed on its own.
        started = time.perf_counter()
        _ = engine.grammars.tokenizer
        tokenizer_setup_s = time.perf_counter() - started
        compiles = time_compiles(engine, settings.num_compiles)
        run_batch(engine, prompts[:2], True, replace(settings, max_tokens=24))
        rounds: dict[str, list[dict]] = {"none": [], "half": []}
        for round_index in range(settings.num_rounds):
            for mode in ("none", "half"):
                progress(f"round {round_index + 1}/{settings.num_rounds}: {mode} constrained")
                rounds[mode].append(run_batch(engine, prompts, mode == "half", settings))
    finally:
        engine.close()

    def median(mode: str, key: str) -> float | None:
        values = [r[key] for r in rounds[mode] if r[key] is not None]
        return statistics.median(values) if values else None

    summary = {
        mode: {
            "tokens_per_s": median(mode, "tokens_per_s"),
            "full_batch_tokens_per_s": median(mode, "full_batch_tokens_per_s"),
        }
        for mode in rounds
    }
    return {
        "dtype": str(engine.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "tokenizer_setup_s": tokenizer_setup_s,
        "compile": compiles,
        "rounds": rounds,
        "summary": summary,
        "slowdown": {
            key: (1 - summary["half"][key] / summary["none"][key])
            if summary["half"][key] and summary["none"][key]
            else None
            for key in ("tokens_per_s", "full_batch_tokens_per_s")
        },
    }
