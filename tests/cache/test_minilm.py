"""The quantized MiniLM (titan/cache/minilm.py) against sentence-transformers' float32 model from
the same package: the vectors the semantic cache and RAG compare must stay the model's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from titan.cache.embedder import Embedder, model_dir
from titan.cache.minilm import QuantizedMiniLM

pytestmark = pytest.mark.slow  # the real model, and the kernels built

ROOT = Path(__file__).resolve().parents[2]
# Questions of every shape the cache meets: short, long, numbers, code, other scripts, empty,
# and one past the model's 256-token window (both truncate it the same way).
SENTENCES = [
    "What is the capital of Australia?",
    "python: what's the way to reverse a list?",
    "Convert 72 degrees Fahrenheit to Celsius, and then to Kelvin.",
    "¿Cuál es la diferencia entre TCP y UDP?",
    "東京の人口は？",
    "SELECT name FROM users WHERE id = 42;",
    "",
    "a",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 60),
]


@pytest.fixture(scope="module")
def models() -> tuple[Embedder, Embedder]:
    quantized = Embedder.load()
    assert isinstance(quantized._model, QuantizedMiniLM), quantized.kind
    return quantized, Embedder.float32()


def labeled_questions(limit: int) -> list[str]:
    path = ROOT / "titan" / "cache" / "training" / "project_pairs.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [text for row in rows[:limit] for text in (row["cached"], row["query"])]


def test_vectors_stay_the_float_models(models):
    quantized, reference = models
    texts = SENTENCES + labeled_questions(100)
    ours, theirs = np.array(quantized.encode(texts)), np.array(reference.encode(texts))
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cosines = (ours * theirs).sum(axis=1)
    worded = np.array([bool(text) for text in texts])
    assert cosines[worded].min() > 0.999, texts[int(np.where(worded, cosines, 2).argmin())]
    assert cosines.min() > 0.995  # the empty text: [CLS] and [SEP] alone, the most sensitive


def test_pair_similarities_move_by_less_than_a_hundredth(models):
    """What the cache decides on: the cosine between a cached question and a new one."""
    quantized, reference = models
    texts = labeled_questions(150)
    ours, theirs = np.array(quantized.encode(texts)), np.array(reference.encode(texts))
    pairs = lambda v: (v[0::2] * v[1::2]).sum(axis=1)  # noqa: E731
    assert np.abs(pairs(ours) - pairs(theirs)).max() < 0.01


def test_a_texts_vector_does_not_depend_on_the_batch(models):
    quantized = models[0]
    together = quantized.encode(SENTENCES)
    assert together == [quantized.encode([text])[0] for text in SENTENCES]
    assert quantized.encode(SENTENCES[::-1]) == together[::-1]
    many = SENTENCES * 12  # past one forward's MAX_TOKENS: split into several
    assert quantized.encode(many) == together * 12


def test_token_offsets_are_the_tokenizers(models):
    quantized, reference = models
    document = "Titan serves models; RAG cuts documents by tokens. " * 80  # past the window
    assert quantized.token_offsets(document) == reference.token_offsets(document)


def test_another_pipeline_is_refused(tmp_path, models):
    """A model directory whose sentence-transformers pooling is not the mean: minilm.py does
    not compute it, so it refuses rather than return other vectors."""
    copy = tmp_path / "model"
    shutil.copytree(model_dir(), copy)
    pooling = copy / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    pooling.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="pooling"):
        QuantizedMiniLM.load(copy, models[0]._model._kernels)


def test_the_portable_build_computes_the_same_vectors(models):
    """bert.c on a CPU without AVX2 (the x86-64 baseline build: scalar quantizing, no FMA)
    against this machine's build: the same model within float rounding (which moves an int8
    activation's rounding now and then: the vectors differ by more than float32's epsilon)."""
    from titan.kernels.build import build_library, default_cache_dir
    from titan.kernels.library import CpuKernels

    # cached where the engine's kernel tests build their x86-64 target too: compiled once
    library = build_library(default_cache_dir(), march="x86-64")
    assert library is not None
    portable = QuantizedMiniLM.load(model_dir(), CpuKernels(library, 2))
    texts = SENTENCES + labeled_questions(20)
    ours = np.array(models[0].encode(texts))
    theirs = np.array(portable.encode(texts))
    cosines = (ours * theirs).sum(axis=1)
    assert cosines[[bool(text) for text in texts]].min() > 0.9998
    assert cosines.min() > 0.999  # the empty text, as against the float model
    pairs = list(zip(texts[:-1:2], texts[1::2], strict=True))
    mine, other = models[0]._model.pair_states(pairs), portable.pair_states(pairs)
    norms = np.linalg.norm(mine, axis=1) * np.linalg.norm(other, axis=1)
    assert ((mine * other).sum(axis=1) / norms).min() > 0.9995  # the cross-encoder's [CLS] states
