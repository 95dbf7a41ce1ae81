"""Shared fixtures for engine tests that load the real SmolLM2 model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.model.loader import resolve_model
from titan.engine.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def hf_dir() -> Path:
    """The bundled GGUF model converted to an HF directory (cached across runs)."""
    return resolve_model(None, EngineConfig().resolved_cache_dir() / "models").hf_dir


@pytest.fixture(scope="session")
def kernel_cache() -> Path:
    """Where the engine caches its compiled kernels: the kernel tests build their other targets
    there too, under the same key of sources, compiler, flags and target, so a rerun on the same
    machine compiles only what changed."""
    return EngineConfig().resolved_cache_dir() / "kernels"


@pytest.fixture(scope="session")
def tokenizer(hf_dir: Path) -> Tokenizer:
    return Tokenizer(hf_dir, (2,), 1)


@pytest.fixture(scope="session")
def float32_engine() -> Iterator[Engine]:
    """One float32 engine (the reference path) for every test that only runs requests to the
    end on it: outputs never depend on what it ran before (its prefix cache serves the same
    bits), so sharing it changes nothing but the time. Tests that count steps, blocks or cache
    hits build their own."""
    engine = Engine(EngineConfig(dtype="float32"))
    yield engine
    assert not engine.has_unfinished, "a test left requests running on the shared engine"


def chat(engine: Engine, text: str) -> list[int]:
    """One user message in the model's chat template, as token ids."""
    tokenizer = engine.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def run_engine(engine: Engine, prompts: dict[str, list[int]], params) -> dict[str, list[int]]:
    """Add all prompts at once, step until every request (theirs and any already added) is done;
    request id -> generated token ids, for the given prompts."""
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished:
        for output in engine.step():
            if output.request_id in tokens:
                tokens[output.request_id].extend(output.token_ids)
    return tokens
